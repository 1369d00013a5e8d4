"""Benchmark of one `apply_gradients` step on an embedding table (issue #4).

Every measured step is a `tf.function` (mode `graph`) or a
`tf.function(jit_compile=True)` (mode `xla`) that applies one row-sparse
gradient (`tf.IndexedSlices`: a batch of Zipf-distributed ids with one gradient
row each, duplicates included) to a `rows x dim` float32 table, then returns a
one-row `sparse_read` of the table, whose `.numpy()` is the synchronisation
point. The ids and gradient rows are arguments of the function, so that no
graph optimisation can precompute the de-duplication. After a compile call and
`--warmup` calls, the steps of one comparison group (our optimizer, its
references, Keras's own optimizer, in both modes) are timed round-robin, one
call at a time with `time.perf_counter`, and the median is reported. Ratios are
therefore between numbers measured side by side in one process.

References, written here:

- `fused`: `tf.unique` + `tf.math.unsorted_segment_sum`, then TensorFlow's
  fused sparse kernel (`ResourceSparseApplyAdagradV2(epsilon=0)`, ...).
- `gather/scatter`: the straightforward lazy Adam (unique, segment sum,
  gather the rows of m, v and w, update, three `scatter_update`).
- `keras`: Keras 3's own optimizer on the same `tf.IndexedSlices`.
- `tfrs`: TF Recommenders' `ClippyAdagrad` on legacy Keras (`tf_keras`),
  loaded as in `tests/test_clippy_adagrad.py`.

Run from the repository root (see `--help`):

    python -m benchmarks.sparse_step [--quick] [--output benchmarks/RESULTS.md]
"""
