"""Performance harness of `tf_tpu_embed_opt` (not part of the installed package).

Run from the repository root:

    python -m benchmarks.sparse_step            # full run, ~10 minutes
    python -m benchmarks.sparse_step --quick    # ~1 minute
    python -m benchmarks.breakdown              # where the sparse step's time goes

`benchmarks/RESULTS.md` holds the numbers measured on the development machine.
"""
