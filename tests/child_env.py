"""The environment of the tests' child Pythons.

A child must import the package the tests import: the checkout's where the
tests run from it, the installed wheel where CI tests that
(`TF_TPU_EMBED_OPT_EXPECT_INSTALLED`). The directory the package was imported
from goes first on the child's `PYTHONPATH`, which serves both.
"""

import os

import tf_tpu_embed_opt

PACKAGE_PARENT = os.path.dirname(
    os.path.dirname(os.path.abspath(tf_tpu_embed_opt.__file__))
)


def child_env(**settings: str) -> dict:
    """`os.environ` with the package's directory first on `PYTHONPATH` and
    `settings` (e.g. `KERAS_BACKEND="jax"`) set."""
    paths = [PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, **settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
