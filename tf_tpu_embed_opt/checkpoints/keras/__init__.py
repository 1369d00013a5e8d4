"""The Keras side of checkpoints: a model's tables and optimizer slots
(`tables`), `load_into_keras` and `save_tpu_checkpoint` (`state`), and steps
of Keras's own `OrbaxCheckpoint` (format `"keras"`, `orbax_reader`)."""
