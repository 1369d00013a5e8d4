"""Performance harness of `tf_tpu_embed_opt` (not part of the installed package).

Run from the repository root:

    python -m benchmarks.sparse_step            # full run, ~10 minutes
    python -m benchmarks.sparse_step --quick    # ~1 minute
    python -m benchmarks.breakdown              # where the sparse step's time goes

`benchmarks/RESULTS.md` holds the numbers measured on the development machine.
"""

import os

# TensorFlow's C++ start-up and runtime log lines (oneDNN, CPU features, CUDA)
# would interleave with the progress lines; an explicit setting still wins.
# This runs before `benchmarks.sparse_step` imports TensorFlow.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
