"""TensorFlow's `TPUEmbedding` checkpoint layout (format `"tpu-embedding"`):
its reader and its writer."""
