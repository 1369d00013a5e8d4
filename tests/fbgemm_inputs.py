"""The lookups and output gradients of the FBGEMM golden runs (issue #54).

`tests/fbgemm_golden.py` feeds them to FBGEMM's CPU kernels where FBGEMM is
installed and records the tables and optimizer states they end with
(`tests/data/fbgemm_golden.npz`); the tests feed the same to this package's
optimizers. NumPy only: both sides draw the same numbers from the same seeds
(NumPy's PCG64 streams are stable across versions and machines).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Iterator, Tuple

import numpy as np

__all__ = [
    "CONFIGS",
    "Config",
    "ROWS",
    "STEPS",
    "initial_table",
    "steps",
    "table_dtype",
]

ROWS = 12  # rows of each table: every row is looked up many times
STEPS = 120
BAGS = 4  # bags per step (pooled) or lookups' groups (unpooled)


@dataclasses.dataclass(frozen=True)
class Config:
    """One golden run: FBGEMM's optimizer, its settings, the lookups' form.

    Attributes:
      optimizer: FBGEMM's `EmbOptimType` member name.
      dim: The table's dimension.
      pooled: Sum-pooled bags (`PoolingMode.SUM`, TorchRec's
        `EmbeddingBagCollection`) or one output per lookup
        (`PoolingMode.NONE`, `EmbeddingCollection`).
      weight_decay_mode: FBGEMM's `WeightDecayMode` member name.
      weight_decay: Its factor (0 with `NONE`).
      learning_rate: The learning rate.
      eps: FBGEMM's `eps` (its default, 1e-8).
      precision: FBGEMM's `weights_precision` (`SparseType` member name):
        `"FP32"`, or `"FP16"` (a TorchRec FP16 table; its state stays
        float32); `"BF16"` for the transcription only (FBGEMM has no CPU
        kernel for it: `fbgemm_reference` rounds to bfloat16 as it rounds to
        float16).
      gradient_scale: Scales the output gradients (small ones show what a
        float16 step would lose).
    """

    optimizer: str
    dim: int
    pooled: bool
    weight_decay_mode: str = "NONE"
    weight_decay: float = 0.0
    learning_rate: float = 0.05
    eps: float = 1e-8
    precision: str = "FP32"
    gradient_scale: float = 1.0

    @property
    def name(self) -> str:
        pooling = "pooled" if self.pooled else "unpooled"
        decay = self.weight_decay_mode.lower()
        table = "" if self.precision == "FP32" else f"-{self.precision.lower()}"
        return f"{self.optimizer.lower()}-{pooling}-d{self.dim}-{decay}{table}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode("ascii"))


def _configs() -> Tuple[Config, ...]:
    configs = []
    for pooled in (True, False):
        for dim in (16, 64, 128):
            for mode, decay in (("NONE", 0.0), ("L2", 0.01), ("DECOUPLE", 0.01)):
                configs.append(
                    Config("EXACT_ROWWISE_ADAGRAD", dim, pooled, mode, decay)
                )
            configs.append(Config("EXACT_ADAGRAD", dim, pooled))
            configs.append(Config("EXACT_SGD", dim, pooled))
        # A TorchRec FP16 table, with gradients whose mean square float16
        # cannot hold (1e-8 < 6e-8): FBGEMM steps it in float32.
        configs.append(
            Config(
                "EXACT_ROWWISE_ADAGRAD",
                64,
                pooled,
                precision="FP16",
                gradient_scale=1e-4,
            )
        )
    return tuple(configs)


CONFIGS = _configs()


def table_dtype(config: Config) -> Any:
    """The NumPy dtype of the table's values: float32, float16 (FP16) or
    ml_dtypes' bfloat16 (BF16)."""
    if config.precision == "BF16":
        import ml_dtypes  # not in FBGEMM's environment, which has no BF16

        return ml_dtypes.bfloat16
    return {"FP32": np.float32, "FP16": np.float16}[config.precision]


def initial_table(config: Config) -> np.ndarray:
    """The table every run starts from: float32 (an FP16 or BF16 table's
    values rounded to its dtype), `[ROWS, dim]`."""
    rng = np.random.default_rng([config.seed, 0])
    table = (rng.normal(size=(ROWS, config.dim)) * 0.1).astype(np.float32)
    return table.astype(table_dtype(config)).astype(np.float32)


def steps(config: Config) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`(ids, offsets, output_gradient)` of each of the `STEPS` steps.

    Ids repeat within a bag and across bags (a Zipf-like draw over `ROWS`);
    `offsets` delimit `BAGS` bags. The output gradient is `[BAGS, dim]`
    pooled, `[len(ids), dim]` unpooled.
    """
    rng = np.random.default_rng([config.seed, 1])
    weights = 1.0 / np.arange(1, ROWS + 1)
    weights /= weights.sum()
    for _ in range(STEPS):
        sizes = rng.integers(1, 6, size=BAGS)
        ids = rng.choice(ROWS, size=int(sizes.sum()), p=weights).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        outputs = BAGS if config.pooled else len(ids)
        gradient = rng.normal(size=(outputs, config.dim)) * config.gradient_scale
        gradient = gradient.astype(np.float32)
        yield ids, offsets, gradient
