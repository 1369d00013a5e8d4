"""The project's own proto: any optimizer of this package, losslessly.

`protos/tf_tpu_embed_opt/optimizer_spec.proto` defines `OptimizerSpec`. Its
compiled descriptor (checked in, see `protos/generate.py`) is loaded into
protobuf's default pool next to TensorFlow's `OptimizationParameters`, so the
message classes work with every protobuf TensorFlow 2.16-2.21 uses.
"""

from tf_tpu_embed_opt.optimizer_spec.records import (
    SPEC_VERSION,
    Face,
    OptimizerSpec,
    from_spec,
    to_spec,
)

__all__ = [
    "SPEC_VERSION",
    "OptimizerSpec",
    "Face",
    "to_spec",
    "from_spec",
]
