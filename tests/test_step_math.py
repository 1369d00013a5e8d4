"""The text `describe` shows for one step is the step that runs.

`rules.step_math` writes an algorithm's update (`Definition.math`) within the
gradient clipping, weight decay and weight clipping that `rules.tpu_step`
applies. Here the text itself is run, as Python, and compared with
`tpu_step`: a text in another order than the code, or one that leaves out a
setting, computes other rows.
"""

# Runs without TensorFlow.

import itertools

import numpy as np
import pytest

from tf_tpu_embed_opt.definitions import configured, registry, rules

# Values at which every setting changes the result: the gradient clip, the
# decay and the weight clip each bind on some element, so that any other
# order of the steps gives other rows.
W = np.array([1.0, -2.0, 0.5, 3.0])
G = np.array([2.0, -3.0, 0.1, -0.2])
A = np.array([0.1, 0.2, 0.3, 0.4])
LR = 0.3

GRADIENT_CLIPS = [(None, None), (-0.5, 0.5), (-0.5, None), (None, 0.5)]
DECAYS = [(None, False), (0.0, False), (0.1, False), (0.1, True)]
WEIGHT_CLIPS = [(None, None), (-0.9, 0.9), (None, 0.9), (-0.9, None)]

# The notation of `Definition.math` for SGD and Adagrad, as Python.
_PYTHON = [
    ("←", "="),
    ("·", "*"),
    ("−", "-"),
    ("η", "lr"),
    ("g²", "g**2"),
    ("√a", "np.sqrt(a)"),
    ("clamp(", "np.clip("),
    ("max(", "np.maximum("),
    ("min(", "np.minimum("),
]


def _run_text(text, w, g, a):
    code = text
    for ours, python in _PYTHON:
        code = code.replace(ours, python)
    names = {"np": np, "w": w.copy(), "g": g.copy(), "a": a.copy(), "lr": LR}
    for statement in code.split(";"):
        exec(statement.strip(), names)
    return names["w"], names["a"]


def _options(gradient_clip, decay, weight_clip):
    return {
        "clip_gradient_min": gradient_clip[0],
        "clip_gradient_max": gradient_clip[1],
        "weight_decay_factor": decay[0],
        "multiply_weight_decay_factor_by_learning_rate": decay[1],
        "clip_weight_min": weight_clip[0],
        "clip_weight_max": weight_clip[1],
    }


@pytest.mark.parametrize("name", ["SGD", "Adagrad"])
@pytest.mark.parametrize(
    "gradient_clip, decay, weight_clip",
    list(itertools.product(GRADIENT_CLIPS, DECAYS, WEIGHT_CLIPS)),
)
def test_the_text_of_a_step_computes_what_the_step_computes(
    name, gradient_clip, decay, weight_clip
):
    definition = registry.BY_NAME[name]
    options = _options(gradient_clip, decay, weight_clip)
    text = rules.step_math(definition.math, options)
    slots = {"accumulators": A} if definition.slots else {}
    hypers = {h.name: h.default for h in definition.hypers}
    w, new_slots = rules.tpu_step(
        definition, rules.NUMPY, W, slots, G, LR, hypers, **options
    )
    text_w, text_a = _run_text(text, W, G, A)
    # Both run in float64, each value through a handful of roundings of
    # 2**-53 each: they agree far inside 1e-12 unless the steps differ, and
    # every setting here moves some element by more than 1e-3.
    np.testing.assert_allclose(text_w, w, rtol=1e-12, atol=0)
    if definition.slots:
        np.testing.assert_allclose(text_a, new_slots["accumulators"], rtol=1e-12)


def test_each_setting_shows_once_and_none_shows_nothing():
    math = registry.BY_NAME["SGD"].math
    assert rules.step_math(math, {}) == math
    # A decay factor of 0 decays nothing (`tpu_step`), so it is not shown.
    assert rules.step_math(math, {"weight_decay_factor": 0.0}) == math
    text = rules.step_math(math, _options((-1.0, 1.0), (0.01, True), (None, 2.0)))
    assert text == (
        "g ← clamp(g, -1.0, 1.0);  w ← w − 0.01·η·w;  w ← w − η·g;  w ← min(w, 2.0)"
    )


def test_a_configured_rule_shows_its_options():
    rule = configured.ConfiguredRule.checked(
        "test",
        registry.BY_NAME["Adagrad"],
        {"epsilon": 0.0},
        {"clip_gradient_max": 1.0, "weight_decay_factor": 0.1},
    )
    assert rule.math == "g ← min(g, 1.0);  w ← w − 0.1·w;  a ← a + g²;  w ← w − η·g/√a"
    # RMSprop's `centered=True` runs CenteredRMSProp: its update is shown.
    centered = configured.ConfiguredRule.checked(
        "test", registry.BY_NAME["RMSProp"], {"centered": True}, {}
    )
    assert centered.math == registry.BY_NAME["CenteredRMSProp"].math


def test_a_keras_only_argument_that_changes_the_update_is_shown():
    """SGD's Keras momentum is no part of the engine's SGD: the update names
    it with its doc (it showed w ← w − η·g alone). At the engine's values,
    `lazy` (which rows step) and a slot's initial value (where it starts)
    show nothing."""
    sgd = registry.BY_NAME["SGD"]
    momentum = configured.ConfiguredRule.checked(
        "test", sgd, {"momentum": 0.9, "nesterov": True, "lazy": True}, {}
    )
    docs = {a.name: a.doc.removesuffix(".") for a in sgd.keras_arguments}
    assert momentum.math == (
        f"{sgd.math};  with momentum=0.9: {docs['momentum']};  "
        f"with nesterov=True: {docs['nesterov']}"
    )
    assert "m ← μ·m − η·g" in docs["momentum"]
    plain = configured.ConfiguredRule.checked("test", sgd, {"lazy": True}, {})
    assert plain.math == sgd.math
    ftrl = registry.BY_NAME["FTRL"]
    starts = configured.ConfiguredRule.checked(
        "test", ftrl, {"initial_linear_value": 0.5, "lazy": False}, {}
    )
    assert starts.math == ftrl.math
