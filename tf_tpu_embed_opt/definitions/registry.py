"""The ordered lists of algorithms that everything else iterates."""

from typing import Dict, Tuple

from tf_tpu_embed_opt.definitions.algorithms import (
    adadelta,
    adagrad,
    adagrad_momentum,
    adam,
    centered_rms_prop,
    clippy_adagrad,
    f2a,
    ftrl,
    laprop,
    momentum,
    proximal_adagrad,
    proximal_yogi,
    rms_prop,
    row_wise_adagrad,
    sgd,
)
from tf_tpu_embed_opt.definitions.spec import Definition

# Every algorithm, in the order the faces, the docs and the command line list
# them. Adding an algorithm is its module in `algorithms/` and one line here;
# everything below, and everything else, is derived (docs/development.md).
ALL: Tuple[Definition, ...] = (
    sgd.DEFINITION,
    adagrad.DEFINITION,
    adagrad_momentum.DEFINITION,
    adam.DEFINITION,
    ftrl.DEFINITION,
    momentum.DEFINITION,
    rms_prop.DEFINITION,
    centered_rms_prop.DEFINITION,
    adadelta.DEFINITION,
    proximal_adagrad.DEFINITION,
    proximal_yogi.DEFINITION,
    row_wise_adagrad.DEFINITION,
    clippy_adagrad.DEFINITION,
    laprop.DEFINITION,
    f2a.DEFINITION,
)

# The algorithms of the TensorFlow engines (`TPUEmbedding`, `TPUEmbeddingV2`):
# each has an `OptimizationParameters` proto and an embedding-face class.
DEFINITIONS: Tuple[Definition, ...] = tuple(d for d in ALL if d.tensorflow_engines)

# The others with a per-row rule: a Keras twin and no proto; jax-tpu-embedding
# runs them (its own spec, or the package's custom spec).
JAX_ONLY: Tuple[Definition, ...] = tuple(
    d for d in ALL if not d.tensorflow_engines and d.engine_refusal is None
)

# What no engine can run (`Definition.engine_refusal`: a step scaled per
# variable, state per row): a Keras class only.
KERAS_ONLY: Tuple[Definition, ...] = tuple(
    d for d in ALL if d.engine_refusal is not None
)

BY_NAME: Dict[str, Definition] = {d.name: d for d in ALL}
BY_PROTO_ONEOF: Dict[str, Definition] = {d.proto_oneof: d for d in DEFINITIONS}
