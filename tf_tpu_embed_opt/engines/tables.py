"""Documentation tables of the engines, derived from the definitions.

docs/guides/sparsecore-keras-rs.md embeds them (tests/test_readme.py checks).
"""

from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.engines.sparsecore import SPARSECORE_OPTIMIZERS

__all__ = ["availability_markdown"]


def availability_markdown() -> str:
    """Which algorithm runs on which engine, and as what."""
    rows = [
        "| Algorithm | `TPUEmbedding` | `TPUEmbeddingV2` (SparseCore, TensorFlow) "
        "| `jax-tpu-embedding` (SparseCore, JAX) |",
        "|---|---|---|---|",
    ]
    for d in registry.ALL:
        tensorcore = "yes" if d.tensorflow_engines else "no"
        sparsecore = "yes" if d.name in SPARSECORE_OPTIMIZERS else "no"
        if d.jax is not None:
            jax = f"`{d.jax.spec_class}`"
        elif d.factor is not None:
            jax = f"no: one {d.factor.name.replace('_', ' ')} per variable"
        elif d.engine_refusal is not None:
            jax = "no: state of one value per row"
        else:
            jax = "`RuleOptimizerSpec` (a `CustomOptimizerSpec`)"
        rows.append(f"| `{d.name}` | {tensorcore} | {sparsecore} | {jax} |")
    return "\n".join(rows) + "\n"
