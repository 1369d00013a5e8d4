"""The programs that train keep the memory their steps free (issue #56,
item 6): glibc's `mallopt`, for their own process only.
"""

# Runs without TensorFlow.

import ast
import platform
import subprocess
import sys
import types

import pytest
from child_env import child_env

from tf_tpu_embed_opt.cli import allocator

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc's malloc on Linux",
)

# Faults of the pages of a 48 MiB block, allocated, written and freed six
# times: glibc's defaults map it anew each time (above its largest mmap
# threshold, 32 MiB), so every round faults its pages in again; kept in the
# heap, only the first round does.
_PROBE = """
import resource, sys
import numpy as np
from tf_tpu_embed_opt.cli import allocator
if sys.argv[1] == "keep":
    allocator.keep_freed_memory()
print(allocator.settings())
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.empty(48 << 20, np.uint8)
    block.fill(1)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults)
"""


def _probe(mode, **environment):
    env = child_env()
    for name in [n for n in env if n.startswith("MALLOC_") or n == "GLIBC_TUNABLES"]:
        del env[name]
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    settings, faults = done.stdout.strip().splitlines()[-2:]
    return settings, ast.literal_eval(faults)


@glibc
def test_kept_memory_is_not_faulted_in_again():
    settings, faults = _probe("default")
    assert settings.startswith("glibc's defaults")
    assert min(faults[1:]) > 100  # a 48 MiB block's pages, every round
    settings, kept = _probe("keep")
    assert settings.startswith("glibc keeps freed memory")
    assert max(kept[1:]) * 10 < min(faults[1:])


@glibc
def test_the_environment_wins():
    settings, faults = _probe("keep", MALLOC_MMAP_MAX_="0")
    assert settings == "MALLOC_MMAP_MAX_=0"
    assert min(faults[1:]) > 100  # this setting alone keeps nothing


def test_the_library_leaves_the_allocator_alone():
    code = "import tf_tpu_embed_opt.cli.allocator as a, tf_tpu_embed_opt\n"
    code += "import tf_tpu_embed_opt.optimizers, tf_tpu_embed_opt.layers\n"
    code += "print(a._kept)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_demo_keeps_freed_memory(monkeypatch):
    import tf_tpu_embed_opt.cli as cli

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append("kept"))
    training = types.ModuleType("tf_tpu_embed_opt.cli.demo_training")
    training.run = lambda args, rate: calls.append("trained") or 0
    monkeypatch.setitem(sys.modules, "tf_tpu_embed_opt.cli.demo_training", training)
    monkeypatch.setattr(cli, "demo_training", training, raising=False)
    assert cli.main(["demo", "--epochs", "1"]) == 0
    assert calls == ["kept", "trained"]
