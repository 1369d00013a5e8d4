"""The optional oracles of the suite: one entry each, used by three parties.

- `tests/conftest.py` gives each test marked `@pytest.mark.oracle("name")` its
  oracle: a test whose oracle is missing FAILS with the install command, unless
  the user opts out explicitly with `TF_TPU_EMBED_OPT_SKIP_ORACLES=name[,name]`
  (or `all`); the run's summary lists which oracles ran, were opted out or are
  not available in this environment.
- `tests/install_oracles.py` (the README's test set-up, and `.ci/run`) installs
  the `requirements` of every entry, with `--no-deps` where asked.
- The README names both.

Adding an oracle is one `Oracle(...)` entry in `ORACLES`. Nothing here imports
TensorFlow at module level: the install script reads this file before the
oracles exist, and probes run only when a test needs them.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Callable, Optional, Tuple

SKIP_VARIABLE = "TF_TPU_EMBED_OPT_SKIP_ORACLES"


@dataclasses.dataclass(frozen=True)
class Oracle:
    """An independent implementation the suite compares the package with.

    Attributes:
      name: Short id, used in `@pytest.mark.oracle(name)` and in
        `TF_TPU_EMBED_OPT_SKIP_ORACLES`.
      description: What it is and which tests use it.
      probe: Returns "" when the oracle works here, else why not.
      requirements: pip requirement strings `tests/install_oracles.py`
        installs; `{tf_minor}` is replaced by the installed TensorFlow's
        "major.minor". Empty: the oracle comes with the environment or not at
        all (e.g. it depends on the protobuf version); then a missing oracle is
        skipped with its reason and listed in the summary, not a failure.
      no_deps: Install the requirements with `pip install --no-deps`.
      extra: The package extra that brings an oracle which is not installable
        here (e.g. "jax"), named when it is missing.
      python: The oldest Python the extra brings it on.
    """

    name: str
    description: str
    probe: Callable[[], str]
    requirements: Tuple[str, ...] = ()
    no_deps: bool = False
    extra: str = ""
    python: Tuple[int, int] = (3, 9)

    @property
    def installable(self) -> bool:
        return bool(self.requirements)


def _tfrs_clippy_adagrad() -> str:
    from tfrs_oracle import load_clippy_adagrad

    return load_clippy_adagrad()[1]


def _keras_rs() -> str:
    import keras_rs  # noqa: F401
    from keras_rs.src.layers.embedding.tensorflow import (  # noqa: F401
        config_conversion,
    )

    return ""


def _jax_tpu_embedding() -> str:
    import jax
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # noqa: F401
    from keras_rs.src.layers.embedding.jax import config_conversion  # noqa: F401

    if not hasattr(jax, "export"):
        return f"JAX {jax.__version__} has no jax.export (tests/jte_oracle.py)"
    return ""


def _keras_optimizer_suites() -> str:
    import pathlib

    import keras
    from keras.src import optimizers, testing  # noqa: F401

    folder = pathlib.Path(optimizers.__file__).parent
    missing = [
        name
        for name in ("sgd_test.py", "optimizer_test.py", "optimizer_sparse_test.py")
        if not (folder / name).is_file()
    ]
    if missing:
        return f"Keras {keras.__version__} does not ship {', '.join(missing)}"
    return ""


ORACLES = (
    Oracle(
        name="tfrs",
        description=(
            "TF Recommenders' ClippyAdagrad on legacy Keras 2 "
            "(tests/test_clippy_adagrad.py)"
        ),
        probe=_tfrs_clippy_adagrad,
        # Both ask for `tensorflow`, which would add a second TensorFlow next
        # to tensorflow-cpu or tensorflow-tpu: hence --no-deps.
        requirements=("tensorflow-recommenders==0.7.7", "tf_keras=={tf_minor}.*"),
        no_deps=True,
    ),
    Oracle(
        name="keras-rs",
        description=(
            "keras-rs's TensorFlow config conversion, run on CPU "
            "(tests/test_keras_rs.py); in the `test` extra on Python >= 3.11"
        ),
        probe=_keras_rs,
        extra="test",
        python=(3, 11),
    ),
    Oracle(
        name="jax-tpu-embedding",
        description=(
            "jax-tpu-embedding's own lowered per-row updates run on CPU, and "
            "keras-rs's JAX conversion (tests/test_jax_engine.py); in the `jax` "
            "extra on Linux x86_64, Python >= 3.11"
        ),
        probe=_jax_tpu_embedding,
        extra="jax",
        python=(3, 11),
    ),
    Oracle(
        name="keras-suites",
        description=(
            "the installed Keras's own optimizer tests, run against the twins "
            "(tests/test_keras_suites.py)"
        ),
        probe=_keras_optimizer_suites,
    ),
)

BY_NAME = {oracle.name: oracle for oracle in ORACLES}


def state_line(name: str, why: str) -> str:
    """What `tests/install_oracles.py` says of oracle `name` after probing.

    An oracle that pip cannot bring here and that is missing is a skip, not a
    failure: it names the extra that brings it.
    """
    if not why:
        return "ok"
    oracle = BY_NAME[name]
    if oracle.installable:
        return why
    if sys.version_info[:2] < oracle.python:
        wanted = ".".join(map(str, oracle.python))
        return f"skipped: needs Python >= {wanted} (this is {sys.version.split()[0]})"
    if oracle.extra:
        extra = oracle.extra
        return f'skipped: needs the `{extra}` extra (pip install ".[{extra}]"); {why}'

    return f"skipped: not available in this environment; {why}"


@functools.lru_cache(maxsize=None)
def why_missing(name: str) -> str:
    """Empty when oracle `name` works here, else why not (probed once)."""
    try:
        return BY_NAME[name].probe()
    except Exception as error:  # noqa: BLE001 - any failure means "missing"
        return f"{type(error).__name__}: {error}"


def opted_out(environ) -> Optional[set]:
    """The oracle names the user chose to skip ({"all"} for every one)."""
    value = environ.get(SKIP_VARIABLE, "")
    names = {part.strip() for part in value.split(",") if part.strip()}
    unknown = names - set(BY_NAME) - {"all"}
    if unknown:
        raise ValueError(
            f"{SKIP_VARIABLE}={value!r} names unknown oracles {sorted(unknown)}; "
            f"known: {', '.join(BY_NAME)} (or all)."
        )
    return names
