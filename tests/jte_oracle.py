"""jax-tpu-embedding's own per-row update, run on the CPU: the JAX engine's oracle.

jax-tpu-embedding lowers each optimizer to a SparseCore custom call that
carries the per-row update as a StableHLO function it writes itself
(`sparsecore/lib/core/primitives/sparse_dense_matmul_grad_with_<name>.py`),
or, for a `CustomOptimizerSpec`, that it makes from the spec's
`custom_computation_fn` (`sparse_dense_matmul_optimizer_grad.py`). The
custom call needs a TPU; the function does not. Here the primitive of a spec
is lowered for TPU (`jax.export`, which needs no TPU), the update function is
cut out of the module and compiled for the CPU, and each row is stepped
through it with the hyperparameters the spec itself computes
(`OptimizerSpec.get_hyperparameters(step)`). Nothing of this package is used:
it is jax-tpu-embedding's code computing, independent of the twins.

The two releases hand a custom function to the primitive differently, and
the oracle asks the installed primitive which it takes (its parameters, not
a version number): 0.1.0's takes the function traced to a jaxpr (`jaxpr=`),
which the lowering inlines; 0.2.0's takes a StableHLO module (`stablehlo=`),
which `embedding.py` makes with the spec's `lower_to_stablehlo` (a
`jax.jit(...).lower` of the function on `(1, dim)` rows, hyperparameters
included) and the lowering merges as written. For 0.2.0 the oracle compiles
that module itself: it is the function the custom call is given.

What this does not cover: the SparseCore kernel around the function (summing
a row's gradient over its samples before the update, which keras-rs's
combiner and jax-tpu-embedding's preprocessing define) - tests sum duplicate
ids themselves, as the engine does.
"""

# Runs without TensorFlow.

import functools
import inspect
import re

import jax
import numpy as np
from jax_tpu_embedding.sparsecore.lib.core.primitives import (
    sparse_dense_matmul_optimizer_grad,
)
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

_CUSTOM_CALL = "SparseDenseMatmulGradOpWithOptimizerUpdate"


def custom_function_parameter():
    """How the installed jax-tpu-embedding gives the custom primitive its
    function: `"jaxpr"` (0.1.0) or `"stablehlo"` (0.2.0), read off the
    parameters of the primitive's abstract evaluation."""
    module = sparse_dense_matmul_optimizer_grad
    evaluation = module._tpu_sparse_dense_matmul_optimizer_grad_abstract_eval
    parameters = inspect.signature(evaluation).parameters
    found = [name for name in ("stablehlo", "jaxpr") if name in parameters]
    if len(found) != 1:
        raise AssertionError(
            "the custom optimizer primitive takes neither a jaxpr nor a StableHLO "
            f"module, or both: {sorted(parameters)}"
        )
    return found[0]


def _custom_module_text(spec, dim, hyperparameters):
    """The StableHLO module 0.2.0's `embedding.py` gives the primitive for a
    custom `spec` (no table limits), its `main` public."""
    slots = len(spec.slot_variables_initializers())
    if spec.stablehlo is not None:
        text = spec.stablehlo
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)
    return spec.lower_to_stablehlo(
        spec.custom_computation_fn,
        embedding_dim=dim,
        num_slot_variables=slots,
        num_hyperparameters=hyperparameters,
    )


def _update_function_text(spec, dim):
    """The StableHLO text of `spec`'s per-row update, as a public `main`."""
    primitive = spec.get_optimizer_primitive()
    hypers = spec.get_hyperparameters(0)
    slots = len(spec.slot_variables_initializers())
    name = f"{spec.short_name()}_oracle_update"
    extra = {}
    if isinstance(spec, embedding_spec.FTRLOptimizerSpec):
        extra["multiply_linear_by_learning_rate"] = bool(
            spec.multiply_linear_by_learning_rate
        )

    rows = 16
    index_operands = [
        np.zeros(8, np.int32),  # row pointers
        np.zeros(rows, np.int32),  # embedding ids
        np.zeros(rows, np.int32),  # sample ids
        np.zeros(rows, np.float32),  # gains
        np.int32(1),  # minibatches
    ]
    variables = [np.zeros((rows, dim), np.float32) for _ in range(1 + slots)]
    activation_gradient = np.zeros((4, dim), np.float32)
    hyper_operands = [np.asarray(h) for h in hypers]
    if isinstance(spec, embedding_spec.CustomOptimizerSpec):
        if custom_function_parameter() == "stablehlo":
            return _custom_module_text(spec, dim, len(hypers))
        # As `tpu_sparse_dense_matmul_grad` binds a custom optimizer: its
        # function traced on (1, dim) rows (gradient, table, slots...,
        # hyperparameters...), the hyperparameters before the variables.
        row = jax.ShapeDtypeStruct((1, dim), np.float32)
        extra["jaxpr"] = jax.make_jaxpr(spec.custom_computation_fn)(
            *[row] * (2 + slots + len(hypers))
        )
        extra["num_hyperparameters"] = len(hypers)
        operands = [*index_operands, activation_gradient, *hyper_operands, *variables]
    else:
        extra["sharding_strategy"] = 1
        extra["enable_minibatching"] = False
        operands = [*index_operands, *variables, activation_gradient, *hyper_operands]

    def lowered(*arrays):
        return primitive.bind(
            *arrays,
            max_ids_per_partition=8,
            max_unique_ids_per_partition=8,
            computation_name=name,
            **extra,
        )

    exported = jax.export.export(
        jax.jit(lowered),
        platforms=["tpu"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_CUSTOM_CALL)],
    )(*operands)
    module = exported.mlir_module()
    match = re.search(
        r"(func\.func private @" + re.escape(name) + r"\(.*?\n  \})", module, re.S
    )
    if match is None:
        raise AssertionError(f"no update function {name} in the lowering")
    function = _strip_locations(match.group(1))
    # XLA's CPU client takes no tuple results: return the tuple's elements.
    tuple_op = re.search(
        r"\n\s*(%\d+) = stablehlo\.tuple (.*?) : tuple<(.*)>\n", function
    )
    value, elements, types = tuple_op.groups()
    function = function.replace(tuple_op.group(0), "\n")
    function = re.sub(
        r"return " + re.escape(value) + r" : tuple<.*>",
        f"return {elements} : {types}",
        function,
    )
    function = re.sub(r"-> tuple<(.*)> \{", r"-> (\1) {", function, count=1)
    function = function.replace(f"func.func private @{name}", "func.func public @main")
    return "module @jte_oracle {\n" + function + "\n}\n"


def _strip_locations(text):
    """`text` without its `loc(...)` annotations (their parentheses nest)."""
    out, index = [], 0
    while True:
        start = text.find("loc(", index)
        if start < 0:
            out.append(text[index:])
            return "".join(out)
        out.append(text[index:start].rstrip(" "))
        depth, position = 0, start + 3
        while True:
            if text[position] == "(":
                depth += 1
            elif text[position] == ")":
                depth -= 1
                if depth == 0:
                    break
            position += 1
        index = position + 1


def _argument_types(text):
    signature = re.search(r"@main\((.*?)\) ->", text, re.S).group(1)
    return re.findall(r"tensor<1x\d+x(\w+)>", signature)


@functools.lru_cache(maxsize=None)
def _compiled(spec_key, dim):
    spec = spec_key.spec
    text = _update_function_text(spec, dim)
    from jax._src.lib import xla_client

    backend = jax.extend.backend.get_backend("cpu")
    options = xla_client.CompileOptions()
    # Every operation rounds once, as written: unoptimized (no algebraic
    # rewrites), and unfused, each operation its own kernel. Inside a fusion
    # XLA:CPU may contract a·b + c into one FMA where the CPU has the
    # instruction; from JAX 0.12 (XLA's newer CPU emitters) it does so at
    # optimization level 0 too (FTRL's `linear + lr·g` rounded once: 1 ulp
    # from the engine's rows on 0.10, read in the HLO both versions compile).
    options.env_option_overrides = [
        ("xla_backend_optimization_level", "0"),
        ("xla_disable_hlo_passes", "algsimp,fusion"),
    ]
    executable = backend.compile_and_load(text, backend.devices()[:1], options)
    return executable, _argument_types(text)


class _Key:
    """Caches by the spec's class and hash (specs hash by their settings)."""

    def __init__(self, spec):
        self.spec = spec

    def __hash__(self):
        return hash((type(self.spec), hash(self.spec)))

    def __eq__(self, other):
        return type(self.spec) is type(other.spec) and hash(self.spec) == hash(
            other.spec
        )


def initial_slots(spec, shape):
    """Each slot's initial value, by jax-tpu-embedding's slot name."""
    initializers = spec.slot_variables_initializers()
    key = jax.random.key(0)
    return {
        name: np.asarray(init(key, shape, np.float32))
        for name, init in zip(initializers._fields, initializers)
    }


def step(spec, table, slots, row_gradients, step_index):
    """One engine step of `spec` on the rows in `row_gradients`.

    Args:
      spec: A jax-tpu-embedding `OptimizerSpec`.
      table: float32 array (rows, dim); not modified.
      slots: {slot name: array (rows, dim)}; not modified.
      row_gradients: {row id: float32 array (dim,)}, duplicates already summed.
      step_index: The step the engine is given (keras-rs: its iteration
        count, 0 at the first step).

    Returns:
      The new table and slots (copies).
    """
    dim = table.shape[1]
    executable, types = _compiled(_Key(spec), dim)
    # keras-rs gives the engine its float32 step (`iteration`).
    hypers = [np.asarray(h) for h in spec.get_hyperparameters(np.float32(step_index))]
    names = list(spec.slot_variables_initializers()._fields)
    table = np.array(table, np.float32)
    slots = {k: np.array(v, np.float32) for k, v in slots.items()}
    device = jax.devices("cpu")[0]
    for row, gradient in row_gradients.items():
        operands = [
            np.asarray(gradient, np.float32)[None, :],
            table[row][None, :],
            *[slots[n][row][None, :] for n in names],
        ]
        for value, kind in zip(hypers, types[len(operands) :]):
            dtype = np.bool_ if kind == "i1" else np.float32
            operands.append(np.full((1, dim), value, dtype))
        if len(operands) != len(types):
            raise AssertionError(f"{len(operands)} operands for {len(types)} arguments")
        outputs = executable.execute([jax.device_put(o, device) for o in operands])
        outputs = [np.asarray(o)[0] for o in outputs]
        table[row] = outputs[0]
        for name, value in zip(names, outputs[1:]):
            slots[name][row] = value
    return table, slots
