"""jax-tpu-embedding's orbax steps (formats `"jax-tpu-embedding"` and
`"keras-rs"`, a step in keras-rs's naming): reader, writer, the job's
processes, its `EmbeddingSpecProto` and stack geometry."""
