"""The demo's loss curves (`demo --plot FILE.png`), drawn with matplotlib
(the `plot` extra), which is imported only here and only when drawing."""

from __future__ import annotations

import math
from typing import Any, List

import numpy as np

__all__ = ["plot_losses"]


def plot_losses(
    path: str,
    runs: List[Any],
    baseline: float,
    hidden: float,
    title: str,
    steps_per_epoch: int,
) -> None:
    """Draws each run's training loss per step and held-out loss per epoch.

    Args:
      path: The PNG file to write.
      runs: The runs to draw (`demo_training.DemoRun`: `label`,
        `step_losses`, `held_out`), each in its own colour.
      baseline: Held-out loss of predicting the click rate (a dashed line).
      hidden: Held-out loss of the model that drew the labels (a dotted line).
      title: The figure's title.
      steps_per_epoch: Training steps in an epoch (the x axis is in epochs).
    """
    import matplotlib

    matplotlib.use("Agg")  # draws to a file, with no display
    from matplotlib import pyplot

    steps = steps_per_epoch
    figure, axes = pyplot.subplots(figsize=(8, 4.5), dpi=100)
    colours = ("tab:blue", "tab:orange")
    for run, colour in zip(runs, colours):
        losses = np.asarray(run.step_losses, dtype="float64")
        # A running mean over 16 steps keeps the curve readable.
        window = min(16, len(losses))
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        x = (np.arange(len(smooth)) + window) / steps
        axes.plot(x, smooth, color=colour, linewidth=1.5, label=f"{run.label}: train")
        axes.plot(
            np.arange(1, len(run.held_out) + 1),
            run.held_out,
            color=colour,
            marker="o",
            linestyle="none",
            label=f"{run.label}: held out",
        )
    axes.axhline(
        baseline, color="grey", linestyle="--", label="predicting the click rate"
    )
    axes.axhline(hidden, color="grey", linestyle=":", label="the hidden model")
    finite = [
        x for run in runs for x in run.step_losses + run.held_out if math.isfinite(x)
    ]
    if finite:
        top = min(max(finite), 3 * baseline)
        axes.set_ylim(min(min(finite), hidden) * 0.95, top * 1.05)
    axes.set_xlabel("epoch")
    axes.set_ylabel("binary cross-entropy")
    axes.set_title(title)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
    pyplot.close(figure)
