"""Conversions between the faces, per engine, and the checks before a job.

- `faces`: `to_embedding` and `to_keras` (Keras <-> embedding face, per
  engine, exact or refused), also public as `tf_tpu_embed_opt.to_embedding`
  and `tf_tpu_embed_opt.to_keras`.
- `keras_reading`: a Keras optimizer read once, at the edge of
  `to_embedding`: its algorithm, arguments, options, learning rate, gradient
  clip, and every setting the engine cannot reproduce, each named.
- `learning_rates`: learning rates across the faces (constants, schedules,
  step functions).
- `preflight`: `check_engine` (`tf_tpu_embed_opt.check_engine`): converts any
  configuration, then asks the engine; `preflight_jax` does the same on
  jax-tpu-embedding (keras-rs on JAX), without TensorFlow.
- `multi_optimizer`: a job's per-table optimizers as one Keras
  `MultiOptimizer` (`keras_optimizer`, `tf_tpu_embed_opt.keras_optimizer`)
  and back (`embedding_optimizers`).
"""
