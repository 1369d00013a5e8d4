"""jax-tpu-embedding custom optimizers generated from the definitions.

jax-tpu-embedding 0.1.0 runs any per-row update through `CustomOptimizerSpec`
(`lib/nn/embedding_spec.py`): `tpu_sparse_dense_matmul_grad` traces its
`custom_computation_fn` with `jax.make_jaxpr` on `(1, dim)` float32 rows, in
the order gradient, table, slots..., hyperparameters..., and
`sparse_dense_matmul_optimizer_grad` lowers the traced function into the
SparseCore program (`lib/nn/embedding.py`, `tpu_sparse_dense_matmul_grad`).
The hyperparameters are what `get_hyperparameters(step)` returns: the base
class gives the learning rate only; `RuleOptimizerSpec` adds the values that
change with the step.

`RuleOptimizerSpec` carries one of this package's twins (its class and
arguments): its row function is the twin's rule (`rules.tpu_step` of the
definition, with gradient clipping, weight decay and weight clipping where the
twin has them), traced with `jax.numpy`, with every hyperparameter a float32
constant as the twin's `rounding="jax-tpu-embedding"` holds it; its slots are
the twin's, with the twin's initial values. So the engine steps a row as the
twin steps it, operation for operation.

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
import numpy as np
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

from tf_tpu_embed_opt.definitions import rules, spec
from tf_tpu_embed_opt.optimizers import twins

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
)

_Key = Tuple[str, Tuple[Tuple[str, Any], ...], Tuple[Tuple[str, Any], ...]]


def _twin(key: _Key) -> Any:
    """The twin of `key`: (class name, arguments, options), rounding as the
    engine rounds; its constructor checks the arguments."""
    name, arguments, options = key
    cls = getattr(twins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, twins.TwinOptimizer)):
        allowed = ", ".join(twins.twin_classes())
        raise ValueError(
            f"RuleOptimizerSpec: argument `optimizer` must name a class of "
            f"tf_tpu_embed_opt.optimizers ({allowed}); received {name!r}."
        )
    twin = cls(
        learning_rate=0.0,
        rounding=spec.JAX_ENGINE,
        **dict(arguments),
        **dict(options),
    )
    if not twin._rows_only:
        raise ValueError(
            f"RuleOptimizerSpec: {name} with lazy=False steps every row of "
            "the table, and jax-tpu-embedding steps only the looked-up rows "
            "(lazy=True computes that)."
        )
    return twin


@functools.lru_cache(maxsize=None)
def _parts(key: _Key) -> Tuple[Callable[..., Any], Tuple[Any, ...], Tuple[str, ...]]:
    """The row function, the slot initializers and the names of the
    step-dependent hyperparameters of `key`, made once per key."""
    twin = _twin(key)
    definition = twin._active
    slots = twin._slots()
    names = tuple(slot.name for slot in slots)
    hypers = twin._hypers_in("float32")
    step_names = _step_names(twin, hypers)
    options = twin._step_options

    def row_update(gradient: Any, table: Any, *rows: Any) -> Tuple[Any, ...]:
        slot_rows = dict(zip(names, rows[: len(names)]))
        learning_rate, *step_values = rows[len(names) :]
        values = {**hypers, **dict(zip(step_names, step_values))}
        new_table, new_slots = rules.tpu_step(
            definition,
            JAX_NUMPY,
            table,
            slot_rows,
            gradient,
            learning_rate,
            values,
            **options,
        )
        return (new_table, *(new_slots[name] for name in names))

    row_update.__name__ = row_update.__qualname__ = f"{key[0]}_row_update"
    # Named as jax-tpu-embedding's own specs name theirs (a named tuple), by
    # the engine's slot names (TensorFlow's load/retrieve op inputs).
    slot_variables = collections.namedtuple(f"{key[0]}SlotVariables", names)
    initializers = slot_variables(
        *(_constant(float(twin._slot_initial(s))) for s in slots)
    )
    return row_update, initializers, step_names


def _step_names(twin: Any, hypers: Mapping[str, Any]) -> Tuple[str, ...]:
    """The hyperparameters the definition computes from the step."""
    if twin._active.step_hypers is None:
        return ()
    return tuple(sorted(twin._active.step_hypers(JAX_NUMPY, np.float32(1), hypers)))


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
      learning_rate: A float, or a callable of the step (jax-tpu-embedding's
        convention: it is called with the step `get_hyperparameters` gets).
      arguments: The twin's algorithm arguments by name (the others take the
        class's defaults).
      options: The twin's engine options (`clip_weight_min`,
        `clip_gradient_max`, `weight_decay_factor`, ...).
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
        given = dict(options or {})
        given.pop("rounding", None)
        twin = _twin((optimizer, _frozen(dict(arguments or {})), _frozen(given)))
        # The key holds every argument and option, defaults included, so that
        # equal twins give the same function whatever was left out.
        key = (
            optimizer,
            _frozen(twin._arguments),
            _frozen(twin._step_options),
        )
        function, initializers, step_names = _parts(key)
        super().__init__(
            learning_rate=learning_rate,
            custom_computation_fn=function,
            slot_variable_initializers_tuple=initializers,
            short_name_str=optimizer.lower(),
        )
        self.optimizer = optimizer
        self.arguments: Dict[str, Any] = dict(twin._arguments)
        self.options: Dict[str, Any] = dict(twin._step_options)
        self._twin = twin
        self._step_names = step_names

    def get_hyperparameters(self, step: Any = None) -> Tuple[Any, ...]:
        """The learning rate of `step` (Keras Adam's bias correction applied
        where the twin has it), then the step-dependent hyperparameters.

        `step` is what jax-tpu-embedding is given (keras-rs: its float32
        iteration count, 0 at the first step); the rule takes them at step
        `step + 1`, as the twin does after `step` steps.
        """
        learning_rate = self.get_learning_rate(0 if step is None else step)
        twin = self._twin
        if not twin._reads_step:
            return (learning_rate,)
        count = jnp.asarray(0 if step is None else step, jnp.float32) + 1
        learning_rate, values = twin._at_step(
            JAX_NUMPY, count, learning_rate, twin._hypers_in("float32")
        )
        return (
            learning_rate,
            *(jnp.asarray(values[name], jnp.float32) for name in self._step_names),
        )

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        options = ", ".join(
            f"{k}={v!r}"
            for k, v in self.options.items()
            if v != twins.ENGINE_OPTIONS[k]
        )
        return (
            f"RuleOptimizerSpec({self.optimizer!r}, learning_rate="
            f"{self.learning_rate!r}, arguments={{{arguments}}}"
            + (f", options={{{options}}}" if options else "")
            + ")"
        )
