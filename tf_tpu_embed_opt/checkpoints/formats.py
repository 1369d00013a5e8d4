"""The checkpoint formats, named and described once.

`READ` is every format `open_checkpoint` reads, in the order `detect_format`
tries them, each with what it is in words; `WRITE` those `write_checkpoint`
writes (keras-rs's steps are jax-tpu-embedding's in keras-rs's naming). The
errors that list what was looked for and the command line's help say them
from here. Nothing is imported, so that `--help` stays fast.
"""

from typing import Dict, Iterable, Tuple

__all__ = ["READ", "WRITE", "described"]

READ: Dict[str, str] = {
    "jax-tpu-embedding": "a jax-tpu-embedding orbax step",
    "keras-rs": "a keras-rs DistributedEmbedding orbax step (JAX)",
    "keras": (
        "a Keras OrbaxCheckpoint step of a model with the package's row-sparse layers"
    ),
    "sparsecore": "a TensorFlow checkpoint in the TPUEmbeddingV2 (SparseCore) layout",
    "tpu-embedding": "a TensorFlow checkpoint in the TPUEmbedding layout",
}

WRITE: Tuple[str, ...] = ("tpu-embedding", "sparsecore", "jax-tpu-embedding")


def described(formats: Iterable[str]) -> str:
    """The formats in words, as one list: "A, B or C"."""
    words = [READ[name] for name in formats]
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} or {words[-1]}"
