"""Packaging for tf_tpu_embed_opt.

TensorFlow comes only through an extra, so that a TPU VM with `tensorflow-tpu`
never gets a second TensorFlow distribution.
"""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
VERSION = re.search(
    r'^__version__ = "([^"]+)"',
    (HERE / "tf_tpu_embed_opt" / "__init__.py").read_text(),
    re.M,
).group(1)

TENSORFLOW_RANGE = ">=2.16,<2.22"

setup(
    name="tf_tpu_embed_opt",
    version=VERSION,
    description=(
        "One optimizer definition for Keras layers and TPU embedding tables: "
        "TPUEmbedding parameter classes that write correct OptimizationParameters."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["tf_tpu_embed_opt", "tf_tpu_embed_opt.*"]),
    package_data={"tf_tpu_embed_opt": ["py.typed"]},
    entry_points={
        "console_scripts": ["tf-tpu-embed-opt = tf_tpu_embed_opt.cli:main"],
    },
    install_requires=[
        "numpy>=1.23",
        # The installed TensorFlow narrows this: 2.16 needs protobuf 4.x,
        # 2.21 needs >= 6.31.
        "protobuf>=4.21.6,<8",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu{TENSORFLOW_RANGE}"],
        "tensorflow": [f"tensorflow{TENSORFLOW_RANGE}"],
        "tpu": [f"tensorflow-tpu{TENSORFLOW_RANGE}"],
        # The Keras face on Keras's JAX backend, without TensorFlow (CPU; on
        # GPU install jax[cuda12] as JAX's documentation says), with keras-rs
        # and jax-tpu-embedding (the `jax-tpu-embedding` engine: its specs,
        # keras-rs's JAX conversion; its wheels are Linux x86_64 only) and
        # orbax (their checkpoints). Python 3.11 or later: JAX 0.9 needs it.
        # The minimums are what CI's minimum-versions leg installs
        # (tests/jax_minimums.txt, which a test holds to these lines). JAX:
        # 0.6.0 has no `jax.experimental.layout.Format`, which keras-rs 0.4.0
        # and jax-tpu-embedding 0.1.0 import; 0.7.0's `jax.sharding.set_mesh`
        # is no context manager, which orbax 0.12.5 enters when a job of
        # several processes saves; jax-tpu-embedding 0.1.0 lowers a custom
        # optimizer only from 0.9.1 (it reads `ClosedJaxpr.constvars`, which
        # 0.7.2 added, and passes `jaxpr_subcomp` an `outer_traceback`, which
        # 0.9.1 added): before it, every custom spec the package makes fails
        # to compile (tests/test_jax_custom_specs.py). Keras 3.15
        # is the first with `keras.optimizers.MultiOptimizer` (the per-table
        # Keras optimizer; 3.14 has none) and what TensorFlow 2.21 ships.
        # Orbax 0.12.5 is the first that writes NumPy arrays without copying
        # them.
        # jax-tpu-embedding 0.2.0 needs Python 3.12 (3.12 and 3.13 get it):
        # 3.11 gets 0.1.0.
        "jax": [
            "jax[cpu]>=0.9.1",
            "keras>=3.15",
            "keras-rs>=0.4",
            "jax-tpu-embedding>=0.1; sys_platform == 'linux' and "
            "platform_machine == 'x86_64'",
            "orbax-checkpoint>=0.12.5",
        ],
        # The documentation site (docs/development.md): `mkdocs build --strict`.
        "docs": [
            "mkdocs==1.6.1",
            "mkdocs-material>=9.5,<10",
            "mkdocstrings[python]>=0.29",
        ],
        # `demo --plot FILE.png` draws the loss curves with matplotlib.
        "plot": ["matplotlib>=3.5"],
        # keras-rs needs only keras and ml-dtypes (no second TensorFlow); its
        # TensorFlow conversion is tested on CPU (tests/test_keras_rs.py).
        "test": [
            "pytest>=7",
            "hypothesis>=6.80",
            "matplotlib>=3.5",
            "keras-rs>=0.4; python_version >= '3.11'",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
