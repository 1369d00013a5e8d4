"""jax-tpu-embedding custom optimizers generated from the definitions.

jax-tpu-embedding runs any per-row update through `CustomOptimizerSpec`
(`lib/nn/embedding_spec.py`), whose `custom_computation_fn` takes `(1, dim)`
float32 rows in the order gradient, table, slots..., hyperparameters... and
returns the new table and slot rows. `tpu_sparse_dense_matmul_grad`
(`lib/nn/embedding.py`) hands it to the primitive
`sparse_dense_matmul_optimizer_grad`, which puts it into the SparseCore
program, in one of two ways:

- 0.1.0 traces the function with `jax.make_jaxpr` and gives the primitive the
  jaxpr (`jaxpr=`), which its lowering inlines;
- 0.2.0 lowers it to a StableHLO module with the spec's `lower_to_stablehlo`
  (`jax.jit(fn).lower(...)` on `(1, dim)` rows, the hyperparameters too; or
  takes the spec's own `stablehlo` text) and gives the primitive the module
  (`stablehlo=`), which its lowering merges as it is.

Either way the function's operations reach the engine as written; nothing
here depends on which. The hyperparameters are what
`get_hyperparameters(step)` returns: the base class gives the learning rate
only; `RuleOptimizerSpec` adds the values that change with the step.

`RuleOptimizerSpec` carries one of this package's twins (its class name and
arguments), as the definitions' `ConfiguredRule` that the twin itself holds
(the Keras face is not imported): its row function is the twin's rule
(`rules.tpu_step` of the definition, with gradient clipping, weight decay and
weight clipping where the twin has them), written with `jax.numpy`, with
every fixed hyperparameter a float32 constant as the twin's
`rounding="jax-tpu-embedding"` holds it and the learning rate and the
step-dependent values the function's own operands; its slots are the twin's, with the
twin's initial values. So the engine steps a row as the twin steps it,
operation for operation.

jax-tpu-embedding's `==` compares specs by the hash of their learning rate,
function, slot initializers and short name; the function and the
initializers are made once per setting, so equal settings give equal specs.

Importing this module imports jax-tpu-embedding.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

from tf_tpu_embed_opt.definitions import configured, rules, spec

__all__ = ["JAX_NUMPY", "RuleOptimizerSpec"]

JAX_NUMPY = rules.ArrayNamespace(
    sqrt=jnp.sqrt,
    square=jnp.square,
    abs=jnp.abs,
    sign=jnp.sign,
    maximum=jnp.maximum,
    minimum=jnp.minimum,
    where=jnp.where,
    power=jnp.power,
    rsqrt=jax.lax.rsqrt,
    divide_no_nan=lambda x, y: jnp.where(y == 0, 0.0, x / jnp.where(y == 0, 1.0, y)),
    min=lambda x: jnp.min(x, initial=jnp.inf),
    sum_in_order=lambda terms: functools.reduce(jnp.add, terms),
    split=lambda x, parts: jnp.split(x, parts, axis=-1),
)

_Key = Tuple[str, Tuple[Tuple[str, Any], ...], Tuple[Tuple[str, Any], ...]]


def _rule(key: _Key) -> configured.ConfiguredRule:
    """The twin of `key`, (class name, arguments, options), as its rule,
    rounding as the engine rounds; the arguments are checked as the twin's
    constructor checks them."""
    name, arguments, options = key
    classes = configured.keras_classes()
    definition = classes.get(name)
    if definition is not None and definition.engine_refusal is not None:
        raise ValueError(
            f"RuleOptimizerSpec: {name} cannot run as a custom optimizer: "
            f"{definition.engine_refusal}."
        )
    if definition is None:
        allowed = ", ".join(n for n, d in classes.items() if d.engine_refusal is None)
        raise ValueError(
            f"RuleOptimizerSpec: argument `optimizer` must name a class of "
            f"tf_tpu_embed_opt.optimizers ({allowed}); received {name!r}."
        )
    _refuse_unknown_names(definition, dict(arguments), dict(options))
    rule = configured.ConfiguredRule.checked(
        name,
        definition,
        dict(arguments),
        {**dict(options), "rounding": spec.JAX_ENGINE},
    )
    if not rule.rows_only:
        raise ValueError(
            f"RuleOptimizerSpec: {name} with lazy=False steps every row of "
            "the table, and jax-tpu-embedding steps only the looked-up rows "
            "(lazy=True computes that)."
        )
    return rule


def _refuse_unknown_names(
    definition: spec.Definition,
    arguments: Mapping[str, Any],
    options: Mapping[str, Any],
) -> None:
    """Refuses a name the twin does not take in `arguments` (its Keras
    arguments) or `options` (its engine options), naming which and where the
    name belongs if it belongs in the other."""
    name = definition.keras.name
    takes = {
        "arguments": [a.name for a in definition.keras_arguments],
        "options": [
            o
            for o in (
                configured.ENGINE_OPTIONS if definition.keras.engine_options else ()
            )
            if o != "rounding"
        ],
    }
    for where, given in (("arguments", arguments), ("options", options)):
        unknown = sorted(set(given) - set(takes[where]))
        if unknown:
            other = "options" if where == "arguments" else "arguments"
            moved = [n for n in unknown if n in takes[other]]
            hint = f"; {moved} go in `{other}`" if moved else ""
            raise TypeError(
                f"RuleOptimizerSpec: argument `{where}` has {unknown}, which "
                f"{name} does not take there; `{where}` takes "
                f"{', '.join(takes[where]) or 'nothing'}{hint}."
            )


@functools.lru_cache(maxsize=None)
def _parts(key: _Key) -> Tuple[Callable[..., Any], Tuple[Any, ...], Tuple[str, ...]]:
    """The row function, the slot initializers and the names of the
    step-dependent hyperparameters of `key`, made once per key."""
    rule = _rule(key)
    slots = rule.slots()
    names = tuple(slot.name for slot in slots)
    hypers = rule.hypers_in("float32")
    step_names = rule.step_hyper_names()

    def row_update(gradient: Any, table: Any, *rows: Any) -> Tuple[Any, ...]:
        slot_rows = dict(zip(names, rows[: len(names)]))
        learning_rate, *step_values = rows[len(names) :]
        values = {**hypers, **dict(zip(step_names, step_values))}
        new_table, new_slots = rule.step(
            JAX_NUMPY, table, slot_rows, gradient, learning_rate, values
        )
        return (new_table, *(new_slots[name] for name in names))

    row_update.__name__ = row_update.__qualname__ = f"{key[0]}_row_update"
    # Named as jax-tpu-embedding's own specs name theirs (a named tuple), by
    # the engine's slot names (TensorFlow's load/retrieve op inputs).
    slot_variables = collections.namedtuple(f"{key[0]}SlotVariables", names)
    initializers = slot_variables(
        *(_constant(float(rule.slot_initial(s))) for s in slots)
    )
    return row_update, initializers, step_names


@functools.lru_cache(maxsize=None)
def _constant(value: float) -> Any:
    return jax.nn.initializers.constant(value)


def _frozen(values: Mapping[str, Any]) -> Tuple[Tuple[str, Any], ...]:
    return tuple(sorted(values.items()))


class RuleOptimizerSpec(embedding_spec.CustomOptimizerSpec):
    """A jax-tpu-embedding custom optimizer that runs one of this package's twins.

    `tf_tpu_embed_opt.to_embedding(twin, engine="jax-tpu-embedding")` returns
    one for a twin without a jax-tpu-embedding spec of its own (Momentum,
    RMSprop, Adadelta, ProximalAdagrad, ProximalYogi, ... with `lazy=True`),
    and `to_keras` gives the twin back. The SparseCore steps each looked-up
    row with the twin's rule, rounded as the twin with
    `rounding="jax-tpu-embedding"` rounds.

    Args:
      optimizer: The twin's class name in `tf_tpu_embed_opt.optimizers`
        (`"Momentum"`).
      learning_rate: A finite number >= 0, or a callable of the step
        (jax-tpu-embedding's convention: it is called with the step
        `get_hyperparameters` gets).
      arguments: The twin's algorithm arguments by name (the others take the
        class's defaults).
      options: The twin's engine options (`clip_weight_min`,
        `clip_gradient_max`, `weight_decay_factor`, ...). `rounding`, if
        given, must be `"jax-tpu-embedding"`: the rule is rounded as the
        engine rounds.

    Raises:
      TypeError: `optimizer` is not a string, `learning_rate` no number or
        callable; an argument or option the twin does not have.
      ValueError: A learning rate below 0 or not finite, a class with no row
        rule for the engine, a value the twin refuses, or another `rounding`.
    """

    def __init__(
        self,
        optimizer: str,
        learning_rate: Any = 0.001,
        arguments: Optional[Mapping[str, Any]] = None,
        options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if not isinstance(optimizer, str):
            raise TypeError(
                "RuleOptimizerSpec: argument `optimizer` must be the name of a "
                f"class of tf_tpu_embed_opt.optimizers; received {optimizer!r}."
            )
        if not callable(learning_rate):
            spec.check_real(
                "RuleOptimizerSpec", "learning_rate", learning_rate, spec.NON_NEGATIVE
            )
        given = dict(options or {})
        rounding = given.pop("rounding", spec.JAX_ENGINE)
        if rounding != spec.JAX_ENGINE:
            raise ValueError(
                "RuleOptimizerSpec: argument `options` sets "
                f"rounding={rounding!r}; the SparseCore steps each row rounded "
                f"as jax-tpu-embedding rounds, so only {spec.JAX_ENGINE!r} is "
                "allowed (or leave it out)."
            )
        rule = _rule((optimizer, _frozen(dict(arguments or {})), _frozen(given)))
        # The key holds every argument and option, defaults included, so that
        # equal twins give the same function whatever was left out.
        key = (optimizer, _frozen(rule.arguments), _frozen(rule.step_options))
        function, initializers, step_names = _parts(key)
        super().__init__(
            learning_rate=learning_rate,
            custom_computation_fn=function,
            slot_variable_initializers_tuple=initializers,
            short_name_str=optimizer.lower(),
        )
        self.optimizer = optimizer
        self.arguments: Dict[str, Any] = dict(rule.arguments)
        self.options: Dict[str, Any] = dict(rule.step_options)
        self.rule = rule
        self._step_names = step_names

    def get_hyperparameters(self, step: Any = None) -> Tuple[Any, ...]:
        """The learning rate of `step` (Keras Adam's bias correction applied
        where the twin has it), then the step-dependent hyperparameters.

        `step` is what jax-tpu-embedding is given (keras-rs: its float32
        iteration count, 0 at the first step); the rule takes them at step
        `step + 1`, as the twin does after `step` steps.
        """
        learning_rate = self.get_learning_rate(0 if step is None else step)
        rule = self.rule
        if not rule.reads_step:
            return (learning_rate,)
        count = jnp.asarray(0 if step is None else step, jnp.float32) + 1
        learning_rate, values = rule.at_step(
            JAX_NUMPY, count, learning_rate, rule.hypers_in("float32")
        )
        return (
            learning_rate,
            *(jnp.asarray(values[name], jnp.float32) for name in self._step_names),
        )

    @property
    def given_options(self) -> Dict[str, Any]:
        """The engine options that differ from their defaults (what its
        `repr` and `check_engine`'s report show)."""
        return {
            k: v for k, v in self.options.items() if v != configured.ENGINE_OPTIONS[k]
        }

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        options = ", ".join(f"{k}={v!r}" for k, v in self.given_options.items())
        return (
            f"RuleOptimizerSpec({self.optimizer!r}, learning_rate="
            f"{self.learning_rate!r}, arguments={{{arguments}}}"
            + (f", options={{{options}}}" if options else "")
            + ")"
        )
