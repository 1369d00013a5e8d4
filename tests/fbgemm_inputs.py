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
from typing import Iterator, Tuple

import numpy as np

__all__ = ["CONFIGS", "Config", "ROWS", "STEPS", "initial_table", "steps"]

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
    """

    optimizer: str
    dim: int
    pooled: bool
    weight_decay_mode: str = "NONE"
    weight_decay: float = 0.0
    learning_rate: float = 0.05
    eps: float = 1e-8

    @property
    def name(self) -> str:
        pooling = "pooled" if self.pooled else "unpooled"
        decay = self.weight_decay_mode.lower()
        return f"{self.optimizer.lower()}-{pooling}-d{self.dim}-{decay}"

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
    return tuple(configs)


CONFIGS = _configs()


def initial_table(config: Config) -> np.ndarray:
    """The table every run starts from: float32, `[ROWS, dim]`."""
    rng = np.random.default_rng([config.seed, 0])
    return (rng.normal(size=(ROWS, config.dim)) * 0.1).astype(np.float32)


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
        gradient = rng.normal(size=(outputs, config.dim)).astype(np.float32)
        yield ids, offsets, gradient
