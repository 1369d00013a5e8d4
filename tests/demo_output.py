"""Reading the demo's output in tests."""

# Runs without TensorFlow.

import re

# A row of the demo's table of both runs: the epoch, then per run its
# training and held-out loss.
_ROW = re.compile(r"^ +(\d+)((?: +(?:[-\d.]+|nan|inf))+) *$", re.M)


def demo_losses(out, run=1):
    """The per-epoch training losses of run 1 (the twin) or 2 (stock
    Keras), read from the table of both runs (the demo prints each loss
    once, there)."""
    table = out.split("held out, for scale", 1)[0].rsplit("\n\n", 1)[1]
    losses = []
    for match in _ROW.finditer(table):
        values = match.group(2).split()
        if len(values) >= 2 * run:
            losses.append(float(values[2 * (run - 1)]))
    return losses
