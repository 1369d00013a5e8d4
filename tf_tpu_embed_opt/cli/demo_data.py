"""The demo's data and model: synthetic click-through data from a hidden
logistic model, and a small ranking model over three embedding tables."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np

__all__ = [
    "BATCH",
    "DENSE_FEATURES",
    "EXAMPLES",
    "HELD_OUT",
    "TABLES",
    "cross_entropy",
    "ranking_model",
    "synthetic_ctr_data",
]

EXAMPLES = 32768
HELD_OUT = 8192
BATCH = 256
# (feature, vocabulary size, embedding dimension)
TABLES = (("user_id", 2000, 16), ("item_id", 1000, 16), ("category", 50, 8))
DENSE_FEATURES = 4
_BIAS_SCALE = 1.0
_AFFINITY_SCALE = 0.7


def _zipf_ids(rng: np.random.Generator, vocabulary: int, count: int) -> np.ndarray:
    """Ids with Zipf-like popularity (p ∝ 1/rank^1.05), ranks shuffled."""
    weights = 1.0 / np.arange(1, vocabulary + 1) ** 1.05
    ranks = rng.choice(vocabulary, size=count, p=weights / weights.sum())
    return rng.permutation(vocabulary)[ranks].astype("int32")


def synthetic_ctr_data(
    seed: int, examples: int = EXAMPLES
) -> Tuple[Dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A click-through-rate dataset with labels from a hidden logistic model.

    The hidden model adds a bias per user, item and category, a user-item
    affinity and a linear function of the dense features.

    Args:
      seed: Seed of numpy's generator.
      examples: Number of impressions.

    Returns:
      (features, labels, probabilities): `user_id`, `item_id`, `category`
      (int32 ids) and `dense` (float32, `[examples, 4]`); float32 labels
      `[examples, 1]`; the hidden model's click probabilities `[examples]`.
    """
    rng = np.random.default_rng(seed)
    (_, users, _), (_, items, _), (_, categories, _) = TABLES
    user = _zipf_ids(rng, users, examples)
    item = _zipf_ids(rng, items, examples)
    item_category = rng.integers(0, categories, size=items).astype("int32")
    category = item_category[item]
    dense = rng.normal(size=(examples, DENSE_FEATURES)).astype("float32")
    user_taste = rng.normal(size=(users, 2))
    item_profile = rng.normal(size=(items, 2))
    logits = (
        rng.normal(scale=_BIAS_SCALE, size=users)[user]
        + rng.normal(scale=_BIAS_SCALE, size=items)[item]
        + rng.normal(scale=_BIAS_SCALE, size=categories)[category]
        + _AFFINITY_SCALE * np.sum(user_taste[user] * item_profile[item], axis=1)
        + dense @ rng.normal(scale=0.5, size=DENSE_FEATURES)
        - 0.5
    )
    probabilities = 1.0 / (1.0 + np.exp(-logits))
    labels = rng.random(examples) < probabilities
    features = {"user_id": user, "item_id": item, "category": category, "dense": dense}
    return features, labels.astype("float32")[:, None], probabilities


def cross_entropy(labels: np.ndarray, probabilities: np.ndarray) -> float:
    p = np.clip(probabilities, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def ranking_model(row_sparse: Optional[Any] = None) -> Tuple[Any, List[Any]]:
    """The model and its tables: `keras.layers.Embedding`s or, given the
    twin `row_sparse`, `layers.Embedding`s each with its own copy of it."""
    inputs = {
        name: keras.Input(shape=(), dtype="int32", name=name) for name, _, _ in TABLES
    }
    inputs["dense"] = keras.Input(shape=(DENSE_FEATURES,), name="dense")
    if row_sparse is None:
        tables = [
            keras.layers.Embedding(vocabulary, dim, name=f"{name}_table")
            for name, vocabulary, dim in TABLES
        ]
    else:
        from tf_tpu_embed_opt import layers

        config = row_sparse.get_config()
        tables = [
            layers.Embedding(
                vocabulary,
                dim,
                optimizer=type(row_sparse).from_config(config),
                name=f"{name}_table",
            )
            for name, vocabulary, dim in TABLES
        ]
    embedded = [table(inputs[name]) for table, (name, _, _) in zip(tables, TABLES)]
    tower = keras.layers.Concatenate()([*embedded, inputs["dense"]])
    tower = keras.layers.Dense(32, activation="relu", name="hidden")(tower)
    logits = keras.layers.Dense(1, name="logit")(tower)
    return keras.Model(inputs, logits, name="ctr_ranking"), tables
