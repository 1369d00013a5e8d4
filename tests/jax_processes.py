"""Runs the program of the guide "Training across processes on JAX"
(docs/guides/jax-processes.md) as one of several JAX processes.

Run by `test_jax_processes.py`, one process per `PROCESS`, all on 127.0.0.1:

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python tests/jax_processes.py PROCESS PROCESSES PORT OUT [step|fit]

With `PROCESSES=1` (and four devices) it is the one-process reference. The
guide's program is run as it is written there (its ```python block under
"The program", or with `fit` the one under "The same with fit"), then
process 0 writes every variable it trained (tables, slots, step counters),
gathered whole from all the processes, and how the table is laid out, to
`OUT` (`.npz`).

Exact by construction, as `row_sparse_distributed.py`: the guide's loss is
`sum(outputs * g) / 32` with `g` in {+-1/2, +-1, +-2}, so each gradient entry
is a sum of a few such values over 2**5, exact in any order of summation, and
the result must equal the one-process run bit for bit.
"""

import os
import re
import sys

import numpy as np
from doc_pages import ROOT

GUIDE = ROOT / "docs" / "guides" / "jax-processes.md"


# The guide's programs, by the heading of their section.
PROGRAMS = {"step": "## The program\n", "fit": "## The same with fit\n"}


def program(which="step"):
    """The guide's ```python block under the heading of `which`."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split(PROGRAMS[which], 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def results(namespace):
    """Every trained variable, whole on every process; how the table is laid
    out, and how many of its rows this process holds."""
    from jax.experimental import multihost_utils

    net = namespace["net"]
    variables = [*net.trainable_variables, *net.non_trainable_variables]
    if "trainable" in namespace:  # the custom step's state
        values = [*namespace["trainable"], *namespace["non_trainable"]]
    else:  # fit's, in the model's variables
        values = [variable.value for variable in variables]
    out = {}
    for variable, value in zip(variables, values):
        if not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        out[variable.path] = np.asarray(value)
    table = values[0]
    assert variables[0].path == "table/embeddings", variables[0].path
    out["table_sharding"] = np.array(str(table.sharding.spec))
    # The table's rows this process holds (each once, whatever the copies).
    rows = table.shape[0]
    held = {shard.index[0].indices(rows) for shard in table.addressable_shards}
    out["local_rows"] = np.array(sum(len(range(*r)) for r in held))
    return out


# What the test reads in a process's log once its first step has run
# (`_announce_steps`): the step's program, collectives included, compiled and
# run once.
TRAINING = "tf_tpu_embed_opt test: training"


def _announce_steps():
    """Prints `TRAINING` when the guide's custom step places its second
    batch, that is after its first step ran (each step places `x` and `g`
    with `jax.make_array_from_process_local_data`). Read from the program's
    own calls, not from JAX's logs, whose wording differs by release."""
    import jax

    place = jax.make_array_from_process_local_data
    calls = [0]

    def placed(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            print(TRAINING, flush=True)
        return place(*args, **kwargs)

    jax.make_array_from_process_local_data = placed


def main(process, processes, port, out, which="step"):
    if which == "step":
        _announce_steps()
    os.environ.update(
        PROCESS=str(process),
        PROCESSES=str(processes),
        COORDINATOR=f"127.0.0.1:{port}",
    )
    namespace = {"__name__": "__guide__"}
    exec(compile(program(which), str(GUIDE), "exec"), namespace)
    found = results(namespace)
    if process == 0:
        np.savez(out, **found)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6])
