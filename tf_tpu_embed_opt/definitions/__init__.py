"""The single source: one declarative definition per algorithm.

`spec` (the `Definition`, `Hyper`, `Slot` and face declarations), `algorithms`
(one module per algorithm: its definition and update rule), `registry` (every
definition, by name), `rules` (the engine's per-row step written once against
an array namespace) and `tables` (the documentation tables derived from the
definitions). Nothing here imports TensorFlow or Keras: every face, engine and
format of the package is derived from these modules.
"""
