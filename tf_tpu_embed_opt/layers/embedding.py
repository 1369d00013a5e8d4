"""`Embedding`: a `keras.layers.Embedding` that carries its table's optimizer.

TPUEmbedding's contract on CPU/GPU: the table optimizer is applied in the
backward pass, to the rows the batch looked up (duplicate ids summed, each
row stepped once, the engine's lazy rule), and the model's own optimizer
never touches the table. On Keras's JAX backend it is the only way a table
step costs what the batch costs: `keras.layers.Embedding` gives JAX a
gradient the size of the table.

The mechanism (docs/architecture.md, "The row-sparse Embedding"): the lookup
has a custom gradient (`lookup_jax`, `lookup_tensorflow`) whose backward pass
steps the looked-up rows of the table and of the optimizer's slots and
returns them in place of their gradients; the table and the slots are
trainable variables marked `overwrite_with_gradient`, which every Keras
optimizer assigns as they are (no clipping, no weight decay, no slots of its
own). The table optimizer's step counter is marked alike (`table_step`: a
step Keras does not apply leaves it), its learning rate is a non-trainable
variable of the layer, so `fit`, `stateless_call`, `.keras` files and
checkpoints carry both. A zero loss the layer adds gives the backward pass
the factor the loss is scaled by, and the model optimizer's training
features are judged when it is built on the table (`model_optimizer`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, Optional, Tuple

import keras
from keras import ops

from tf_tpu_embed_opt.layers import gradients, model_optimizer
from tf_tpu_embed_opt.layers.ids import integer_ids
from tf_tpu_embed_opt.layers.table_optimizer import ALLOWED, table_optimizer
from tf_tpu_embed_opt.layers.table_state import TableState
from tf_tpu_embed_opt.optimizers import backend

__all__ = ["Embedding", "owner_of", "table_optimizer"]

# The choices of `Embedding(out_of_range_ids=...)`.
OUT_OF_RANGE_IDS = ("error", "zeros")


def lookup_module() -> Any:
    """The backend's lookup: `lookup_jax` or `lookup_tensorflow`."""
    if backend.BACKEND == "jax":
        from tf_tpu_embed_opt.layers import lookup_jax

        return lookup_jax
    if backend.BACKEND == "tensorflow":
        from tf_tpu_embed_opt.layers import lookup_tensorflow

        return lookup_tensorflow
    raise RuntimeError(
        "tf_tpu_embed_opt.layers.Embedding runs on Keras's 'jax' and "
        f"'tensorflow' backends; this Keras runs on {backend.BACKEND!r}."
    )


def _rows_layout(layout: Any) -> Any:
    """The layout of a `[rows, 1]` slot of a table laid out by `layout`:
    sharded as the table's rows, whole along its one column (a table
    sharded over its columns keeps such a slot whole on each device). A
    layout that is no `keras.distribution.TensorLayout` (a backend's own)
    leaves the slot to the distribution."""
    if not isinstance(layout, keras.distribution.TensorLayout):
        return None
    return keras.distribution.TensorLayout(
        (layout.axes[0], None), device_mesh=layout.device_mesh
    )


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class Embedding(TableState, keras.layers.Embedding):
    """A `keras.layers.Embedding` whose table trains with its own optimizer,
    row by row, in the backward pass (TPUEmbedding's contract on CPU/GPU).

    The arguments, outputs, masking and config are `keras.layers.Embedding`'s,
    plus `optimizer`. During training (`fit`, or a call with `training=True`
    whose gradients a Keras optimizer applies) only the rows the batch looked
    up, and their slots, step: duplicate ids are summed and each row steps
    once, by the engine's lazy rule (`docs/tpu_semantics.md`). The optimizer
    the model is compiled with trains the other weights and never the table.

    Example:

    ```python
    layer = tf_tpu_embed_opt.layers.Embedding(
        100_000, 64, optimizer=tf_tpu_embed_opt.optimizers.Adagrad(0.05))
    ```

    The table and the optimizer's slots are the layer's trainable weights,
    marked `overwrite_with_gradient`: their "gradients" are their stepped
    values, which Keras's optimizers write as they are. So call the layer
    once per step; use its table only through the layer (not also as, say, a
    tied output projection); in a custom loop, call the model with
    `training=True` and apply the gradients with a Keras optimizer
    (`optimizer.apply` or `stateless_apply`), unclipped (the model
    optimizer's own clipping leaves them alone). A scaled loss
    (`LossScaleOptimizer`, `mixed_float16`) must include `model.losses`, as
    `fit`'s does: the layer adds a zero loss whose gradient is the scale,
    and the rows step with the unscaled gradient. The model optimizer's
    `gradient_accumulation_steps`, `ema_overwrite_frequency` and, on
    TensorFlow, `use_ema` are refused when it is built on the table.
    With `training=False` the backward pass leaves the table as it is; a
    gradient of the table taken in a call whose `training` was not given is
    refused (Keras's `Embedding` would train there), as is one through a
    read of the table or a slot outside the lookup (`layers/gradients.py`).

    Args:
      input_dim: Number of rows.
      output_dim: Width of a row.
      embeddings_initializer: As in Keras.
      embeddings_regularizer: Must be None: a penalty on the whole table
        would give every row a gradient; use the optimizer's
        `weight_decay_factor` (looked-up rows, as the engine does).
      embeddings_constraint: Must be None.
      mask_zero: As in Keras.
      weights: As in Keras: the table's initial value, an array of shape
        `(input_dim, output_dim)` or a list of one (the optimizer's slots
        start at their initial values). `set_weights` and `load_weights`
        take a `keras.layers.Embedding`'s weights (its table alone) alike.
      lora_rank: Must be None.
      lora_alpha: As in Keras (unused without `lora_rank`).
      quantization_config: Must be None.
      optimizer: The table's optimizer (keyword): one of this package's
        twins with a row-sparse rule (`lazy=True` where it has `lazy`), a
        stock `keras.optimizers` SGD (without momentum) or Adagrad or its
        name, or an embedding-face optimizer or jax-tpu-embedding spec
        (converted with `tf_tpu_embed_opt.to_keras`).
      out_of_range_ids: What an id below 0 or at or past `input_dim` does
        (keyword). `"error"` (the default): it is refused before anything
        is looked up or stepped, with an error naming the layer, the id and
        the range (`tf_tpu_embed_opt.layers.OutOfRangeIds` where the call
        is eager; inside a compiled step the backend's runtime error, whose
        message ends with it; see the guide for XLA on TensorFlow). On
        JAX a model with such a layer is refused by `model.export` (the
        check cannot be exported there; on TensorFlow it is).
        `"zeros"`: it reads a row of zeros and steps no row, as a padded
        entry.
      **kwargs: As in Keras (`name`, `dtype`: a float dtype or policy, ...).

    Call arguments:
      inputs: Integer ids of any shape, as Keras's `Embedding` takes them;
        on TensorFlow also a `tf.RaggedTensor` (the rows come back ragged).
        Sparse ids (`tf.SparseTensor`, JAX's `BCOO`) are refused: Keras's
        `Embedding` reads row 0 wherever they have no entry.
      training: Only with `training=True` does the backward pass step the
        table (`fit` passes it).
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        embeddings_initializer: Any = "uniform",
        embeddings_regularizer: Any = None,
        embeddings_constraint: Any = None,
        mask_zero: bool = False,
        weights: Any = None,
        lora_rank: Optional[int] = None,
        lora_alpha: Optional[float] = None,
        quantization_config: Any = None,
        *,
        optimizer: Any = None,
        out_of_range_ids: str = "error",
        **kwargs: Any,
    ) -> None:
        for name, value, why in (
            (
                "embeddings_regularizer",
                embeddings_regularizer,
                "a penalty on the whole table gives every row a gradient; "
                "use the optimizer's weight_decay_factor (looked-up rows)",
            ),
            (
                "embeddings_constraint",
                embeddings_constraint,
                "Keras applies it to the whole table after its optimizer's "
                "step, which the row step does not run",
            ),
            ("lora_rank", lora_rank, "LoRA trains other variables than the table"),
            ("quantization_config", quantization_config, "a quantized table "),
        ):
            if value is not None:
                raise ValueError(
                    f"Embedding: argument `{name}` must be None ({why}); "
                    f"received {value!r}."
                )
        if out_of_range_ids not in OUT_OF_RANGE_IDS:
            raise ValueError(
                "Embedding: argument `out_of_range_ids` must be one of "
                f"{', '.join(map(repr, OUT_OF_RANGE_IDS))}; received "
                f"{out_of_range_ids!r}."
            )
        self.out_of_range_ids = out_of_range_ids
        if optimizer is None:
            raise TypeError(
                "Embedding: argument `optimizer` (keyword) is required: the "
                f"table's optimizer, {ALLOWED}. Without one, use "
                "keras.layers.Embedding."
            )
        self._lookup = lookup_module()
        self.optimizer = table_optimizer(optimizer)
        # Not handed to Keras: its `set_weights` would take the table and
        # every slot, and `weights` is the table alone.
        super().__init__(
            input_dim,
            output_dim,
            embeddings_initializer=embeddings_initializer,
            mask_zero=mask_zero,
            lora_alpha=lora_alpha,
            **kwargs,
        )
        variable_dtype = self.dtype_policy.variable_dtype
        if not keras.backend.is_float_dtype(variable_dtype):
            raise ValueError(
                "Embedding: argument `dtype` must give the table a float dtype "
                f"(its optimizer steps it); received {kwargs.get('dtype')!r}, "
                f"whose variables are {variable_dtype}."
            )
        self.optimizer._definition.check_table_dtype(
            "Embedding", self.name, keras.backend.standardize_dtype(variable_dtype)
        )
        if weights is not None:
            self.build()
            self._embeddings.assign(self._initial_table(weights))

    def _initial_table(self, weights: Any) -> Any:
        """The table of `weights` (an array, or a list of one, as Keras
        takes it), checked against the table's shape."""
        if isinstance(weights, list) and len(weights) == 1:
            weights = weights[0]
        shape = (self.input_dim, self.output_dim)
        try:
            table = keras.ops.convert_to_numpy(weights)
        except (ValueError, TypeError):
            table = None
        if table is None or table.dtype.kind not in "biuf":
            received = f"{type(weights).__name__} {weights!r:.60}"
        elif tuple(table.shape) != shape:
            received = f"shape {table.shape}"
        else:
            return table
        raise ValueError(
            f"Embedding {self.name!r}: argument `weights` must be the table's "
            f"initial value, an array of numbers of shape {shape} (or a list "
            "of one such array, as Keras takes it; the optimizer's slots "
            f"start at their initial values); received {received}."
        )

    def compute_output_spec(self, inputs: Any, training: Any = None) -> Any:
        self._refuse_a_table_of_a_stack()
        # Ids of a dtype that cannot say every row are refused as the model
        # is built (`integer_ids`), not first when it trains.
        integer_ids(inputs, self.input_dim, self._absent_ids, self.name, self._lookup)
        return super().compute_output_spec(inputs)

    def build(self, input_shape: Any = None) -> None:
        self._refuse_a_table_of_a_stack()
        if self.built:
            return
        # An optimizer built on the table is judged before it trains it; the
        # losses optimizers scale are counted (`gradients.refuse_unprobed`).
        model_optimizer.judge_builds(owner_of, backend.BACKEND)
        model_optimizer.count_scaled_losses()
        shape = (self.input_dim, self.output_dim)
        self._embeddings = self._table_variable(
            "embeddings", shape, self.embeddings_initializer
        )
        # `load_into_keras` and `save_tpu_checkpoint` find the table's own
        # optimizer and slots from its variable.
        self._embeddings._row_sparse_layer = weakref.ref(self)
        slots = self.optimizer.slot_table()
        self._slot_names: Tuple[str, ...] = tuple(name for name, _, _ in slots)
        # Under `keras.distribution` each slot is laid out as the table is
        # (a LayoutMap entry for the table shards its slots' rows alike), so
        # the row step reads and writes the same rows of each on one device;
        # a slot of one value per row only as the table's rows are.
        layout = getattr(self._embeddings, "_layout", None)
        per_row = {s.name for s in self.optimizer._slots() if s.per_row}
        # In the dtype the table steps in (float32 for a 16-bit table whose
        # algorithm keeps float32 state, `Definition.narrow_tables`).
        dtype = self.optimizer._step_dtype(self._embeddings)
        self._slot_variables = [
            self._table_variable(
                keras_name,
                (self.input_dim, 1) if name in per_row else shape,
                backend.constant_initializer(initial),
                layout=_rows_layout(layout) if name in per_row else layout,
                dtype=dtype,
            )
            for name, keras_name, initial in slots
        ]
        # TensorFlow's checkpoints (`tf.train.Checkpoint`) follow a layer's
        # attributes, not the lists Keras tracks: each slot is an attribute
        # of its own, as the table and the step are, so that a checkpoint of
        # the model holds them and restores them as the layer builds.
        for (_, keras_name, _), variable in zip(slots, self._slot_variables):
            setattr(self, f"_slot_{keras_name}", variable)
        # Their gradient is their stepped rows: a gradient through any other
        # read is refused (`gradients`).
        gradients.guard((self._embeddings, *self._slot_variables), self)
        # The table optimizer's step counter, which the backward pass steps
        # with the rows (`table_step`), and its learning rate: state of the
        # layer, which the JAX trainer passes in and out of each step and
        # saving the model saves. Its own counter is left unused.
        self._step_dtype = self.optimizer._iterations.dtype
        self._table_step = self._table_variable(
            "step", (2,), backend.constant_initializer(0.0), dtype="float32"
        )
        if self.optimizer.built:
            # Already a model's optimizer (`model_optimizer.judge_builds`
            # refuses the other order).
            raise ValueError(
                model_optimizer.sharing_refusal(self.optimizer, self._table_words)
            )
        self.optimizer._table_step_of = weakref.ref(self)
        if isinstance(self.optimizer._learning_rate, keras.Variable):
            self._own_learning_rate()
        self.built = True

    def _table_variable(
        self,
        name: str,
        shape: Any,
        initializer: Any,
        layout: Any = None,
        dtype: Any = None,
    ) -> Any:
        extra = {} if layout is None else {"layout": layout}
        with keras.name_scope(self.name, caller=self):
            variable = self._lookup.VARIABLE_CLASS(
                initializer=keras.initializers.get(initializer),
                shape=shape,
                dtype=dtype or self.variable_dtype,
                trainable=True,
                autocast=False,
                name=name,
                **extra,
            )
        variable.overwrite_with_gradient = True
        self._track_variable(variable)
        return variable

    @property
    def embeddings(self) -> Any:
        """The table's variable (Keras's `embeddings`)."""
        self._refuse_a_table_of_a_stack()
        return super().embeddings

    @property
    def slots(self) -> Dict[str, Any]:
        """The table optimizer's slot variables, by the engine's slot name."""
        self._refuse_a_table_of_a_stack()
        return dict(zip(self._slot_names, self._slot_variables))

    # An id equal to `input_dim` is no lookup (`keras_rs_tables`: entries
    # whose weight is 0).
    _absent_ids = False
    # `StackedEmbedding` checks each of its tables' ids against their own
    # rows before its stack's lookup.
    _ids_checked_by_caller = False
    # The `training` of a subclass's call that reaches `call` through a
    # parent's `super().call(inputs)` (keras-rs's EmbedReduce).
    _training_of_caller: Optional[bool] = None
    # What to do instead of calling the layer twice in one training step.
    _instead_of_a_second_call = (
        "look the ids of all its features up in one call (concatenate them, "
        "call the layer once and split its output), or give the layer to a "
        "tf_tpu_embed_opt.layers.StackedEmbedding under each feature, which "
        "does that"
    )
    # The forward pass (`_forward_pass`) of the layer's last training call.
    _stepped_in: Any = None

    def rematerialized_call(self, layer_call: Any, *args: Any, **kwargs: Any) -> Any:
        """`layer_call` as it is: the layer is never rematerialized
        (`keras.RematScope`), as its lookup's backward pass steps the rows
        its forward pass read (`gradients.refuse_rematerialized`); it keeps
        them, the table step's only residual beyond its inputs. The rest of
        the model is rematerialized as the scope says."""
        return layer_call

    def call(self, inputs: Any, training: Optional[bool] = None) -> Any:
        self._refuse_a_table_of_a_stack()
        gradients.refuse_rematerialized(self._table_words)
        if training is None:
            training = self._training_of_caller
        counters = []
        if training:
            self._check_one_call_per_step()
            counters = self._model_counters()
        # Ragged ids (TensorFlow) are looked up by their flat values.
        inputs, structured = self._lookup.flat_ids(inputs, self.name)
        inputs = integer_ids(
            inputs, self.input_dim, self._absent_ids, self.name, self._lookup
        )
        absent = self._absent_ids
        if self.out_of_range_ids == "zeros":
            inputs = outside_as_absent(inputs, self.input_dim)
            absent = True
        elif not self._ids_checked_by_caller:
            # Before anything moves.
            inputs = self._lookup.checked_ids(
                inputs, self.input_dim, absent, self.name, [self._embeddings]
            )
        iterations = self.table_step
        if training:
            learning_rate = self._learning_rate_at(iterations)
            # A refused step leaves the model optimizer's step counters as
            # they were (the table's moves only with its rows).
            with self._lookup.after(inputs):
                self._lookup.hold(counters)
        else:
            # Gradients taken without training=True must not move the table:
            # its "gradient" is then the table itself.
            learning_rate = ops.zeros((), self.variable_dtype)
        # A gradient of a call whose `training` was not given is refused
        # (`gradients`); a frozen table is no gradient's source (on
        # TensorFlow a tape still runs the backward pass for its variable).
        untrained = training is None and self.trainable
        outputs, probe = self._lookup.lookup(
            self._rows_step,
            inputs,
            self._embeddings,
            self._slot_variables,
            learning_rate,
            iterations,
            self._table_step,
            bool(training),
            absent=absent,
            words=self._table_words,
            untrained=untrained,
        )
        if training:
            # A zero loss whose gradient is the factor the loss is scaled by
            # (a LossScaleOptimizer's): the backward pass steps the rows with
            # the unscaled gradient. In the dtype of Keras's losses, which
            # TensorFlow sums only with their own (a float16 table's probe
            # is float16).
            self.add_loss(ops.cast(probe, keras.config.floatx()))
        outputs = ops.cast(outputs, dtype=self.compute_dtype)
        return outputs if structured is None else structured(outputs)

    def step_refusal(self) -> Optional[str]:
        """Why the table cannot train as configured, or None: asked when an
        optimizer is built on it (`model_optimizer.judge_builds`), before
        anything trains; it still loads and serves."""
        dtype = keras.backend.standardize_dtype(self.variable_dtype)
        return self.optimizer.rule.step_refusal(self._table_words, dtype)

    @property
    def _table_words(self) -> str:
        """The table in a message that refuses it."""
        return f"Embedding: table {self.name!r}"

    def _learning_rate_at(self, iterations: Any) -> Any:
        """The table optimizer's learning rate at step `iterations`: Keras's
        reading of it (a schedule at the optimizer's step counter)."""
        schedule = self.optimizer._learning_rate
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            return ops.convert_to_tensor(schedule(iterations))
        # In its own dtype: under a mixed policy Keras would cast the
        # variable to the compute dtype here (float16: 0.2 becomes 0.19995).
        with _no_autocast():
            return ops.convert_to_tensor(self.optimizer.learning_rate)

    def _check_one_call_per_step(self) -> None:
        """Refuses a second training call in one forward pass: each call's
        backward pass would step the table on its own ids, from the same
        rows, and Keras would write only one (or the sum) of the results;
        a row must step once with the gradient of all its lookups."""
        context = _forward_pass()
        if context is None:
            return
        if self._stepped_in is not None and self._stepped_in() is context:
            raise ValueError(
                f"Embedding {self.name!r} is called a second time in one "
                "training step. Its table steps in the backward pass of each "
                "call, so several calls would step it apart, each from the "
                "same rows, where a row must step once with the gradient of "
                "all its lookups. Instead, "
                f"{self._instead_of_a_second_call}. (A "
                "keras.layers.TimeDistributed around the layer calls it once "
                "per time step: call the layer itself on the ids of all the "
                "steps, which it takes in any shape.)"
            )
        self._stepped_in = weakref.ref(context)

    def _model_counters(self) -> list:
        """The step counters of the compiled optimizer of the model whose
        call runs this one (`model(x, training=True)`, as TensorFlow's `fit`
        calls it), which a refused step must leave as they are."""
        context = _call_context()
        return model_optimizer.counters(getattr(context, "entry_layer", None))

    def _rows_step(self, rows, slot_rows, gradient_rows, learning_rate, iterations):
        new_rows, new_slots = self.optimizer.rows_step(
            rows,
            dict(zip(self._slot_names, slot_rows)),
            gradient_rows,
            learning_rate,
            iterations,
        )
        return new_rows, tuple(new_slots[name] for name in self._slot_names)

    def enable_lora(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(
            f"Embedding {self.name!r}: enable_lora is refused: LoRA trains "
            "other variables than the table, which this layer steps row by "
            "row; use keras.layers.Embedding."
        )

    def quantize(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(
            f"Embedding {self.name!r}: quantize is refused: a quantized table "
            "cannot be stepped row by row; use keras.layers.Embedding."
        )

    def get_config(self) -> Dict[str, Any]:
        config = super().get_config()
        config["optimizer"] = keras.optimizers.serialize(self.optimizer)
        config["out_of_range_ids"] = self.out_of_range_ids
        return config

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> keras.layers.Embedding:
        """The layer of `config`; a config without `optimizer` is an older
        file's `tf_tpu_embed_opt.sharded.Embedding`.

        Until it got its own registered name (`"tf_tpu_embed_opt>
        ShardedEmbedding"`), the sharded layer was saved under this layer's,
        `"tf_tpu_embed_opt>Embedding"`; its config has no `optimizer`
        (which this layer always saves), so such a file still loads as the
        layer that wrote it (Keras's own `Embedding` off TensorFlow, which
        the sharded layer is there).
        """
        if "optimizer" in config:
            return super().from_config(config)
        if backend.BACKEND == "tensorflow":
            from tf_tpu_embed_opt.layers import sharded

            return sharded.Embedding.from_config(config)
        return keras.layers.Embedding.from_config(config)


def outside_as_absent(
    ids: Any, rows: int, offset: int = 0, absent: Optional[int] = None
) -> Any:
    """`ids + offset`, where each id outside `[0, rows)` becomes `absent`
    (by default `rows + offset`, the id past the table), which is no lookup:
    `out_of_range_ids="zeros"`."""
    inside = (ids >= 0) & (ids < rows)
    return ops.where(inside, ids + offset, rows + offset if absent is None else absent)


def _forward_pass() -> Any:
    """What marks one forward pass: the stateless scope of
    `stateless_call` (Keras's JAX trainer, which calls the model's `call`
    directly) or else the call context of the outermost layer call under way.
    Both are private to Keras: None where they are not found."""
    try:
        from keras.src.backend.common import stateless_scope
    except ImportError:  # pragma: no cover - another Keras layout
        return None
    scope = stateless_scope.get_stateless_scope()
    if scope is not None:
        return scope
    return _call_context()


def _no_autocast() -> Any:
    """A scope in which Keras variables read in their own dtype (private to
    Keras: none where it is not found)."""
    try:
        from keras.src.backend import AutocastScope
    except ImportError:  # pragma: no cover - another Keras layout
        return contextlib.nullcontext()
    return AutocastScope(None)


def _call_context() -> Any:
    """Keras's context of the outermost layer call under way (its
    `entry_layer` is that layer), or None (private to Keras)."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # pragma: no cover - another Keras layout
        return None
    return global_state.get_global_attribute("current_call_ctx")


def owner_of(variable: Any) -> Optional[Embedding]:
    """The row-sparse layer whose table `variable` is, or None."""
    owner = getattr(variable, "_row_sparse_layer", None)
    return owner() if owner is not None else None
