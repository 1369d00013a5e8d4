"""Which algorithm a table's state in an engine's checkpoint belongs to.

Every writer of an engine's layout, and SparseCore's reader (whose slots do not
name the algorithm), take it as a definition, a definition's name or an
optimizer of the embedding face; `definition_of` turns each into the
definition once, and refuses an algorithm whose state no engine's checkpoint
holds (`refuse_engine_state`).
"""

from typing import Any, Dict, List, Mapping, Union

from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.errors import is_tensorflow_missing

__all__ = [
    "OptimizerLike",
    "definition_of",
    "refuse_engine_state",
    "slot_names",
    "stack_definitions",
]

# A definition, a definition's name or an optimizer of the embedding face.
OptimizerLike = Any


def definition_of(optimizer: OptimizerLike, what: str) -> spec.Definition:
    """The algorithm of `optimizer`, whose state goes to or comes from an
    engine's checkpoint: a definition, a definition name, or an optimizer of
    the embedding face (`what` names it in errors).

    Raises:
      ValueError: An unknown name, or an algorithm no engine runs (its state
        has no place in an engine's checkpoint: `refuse_engine_state`).
      TypeError: Neither of those forms.
    """
    if isinstance(optimizer, spec.Definition):
        definition = optimizer
    elif isinstance(optimizer, str):
        if optimizer not in registry.BY_NAME:
            alike = [n for n in registry.BY_NAME if n.lower() == optimizer.lower()]
            hint = f" (names are case-sensitive: {alike[0]!r})" if alike else ""
            raise ValueError(
                f"{what}: unknown algorithm {optimizer!r}{hint}; allowed: "
                f"{sorted(registry.BY_NAME)}."
            )
        definition = registry.BY_NAME[optimizer]
    else:
        try:
            from tf_tpu_embed_opt.embedding import parameters as embedding
        except ModuleNotFoundError as error:
            if not is_tensorflow_missing(error):
                raise
            # Every embedding optimizer is a TensorFlow class: without
            # TensorFlow, this is none.
            raise TypeError(
                f"{what}: expected an algorithm's name, a Definition or an "
                f"embedding optimizer; received {optimizer!r} of type "
                f"{type(optimizer).__name__}."
            ) from None
        try:
            definition = embedding.definition_of(optimizer)
        except TypeError as error:
            raise TypeError(f"{what}: {error}") from None
    refuse_engine_state(definition, what)
    return definition


def refuse_engine_state(definition: spec.Definition, what: str) -> None:
    """Refuses, naming `what`, an algorithm whose state no engine's
    checkpoint holds (`Definition.engine_refusal`: one value per row, or a
    step scaled per variable); Keras's own checkpoints hold it."""
    if definition.engine_refusal is not None:
        raise ValueError(
            f"{what}: {definition.name}'s state has no place in an engine's "
            f"checkpoint: {definition.engine_refusal}. Keep it in Keras's own "
            "checkpoints (model.save, tf.train.Checkpoint, "
            "keras.callbacks.OrbaxCheckpoint)."
        )


def stack_definitions(
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    stacks: Mapping[str, List[Any]],
    argument: str = "`optimizer`",
) -> Dict[str, spec.Definition]:
    """Each stacked table's algorithm, from one optimizer or one per table.

    `stacks` holds each stacked table's SparseCore layouts
    (`stacks.group_layouts`); `argument` is what the caller calls
    `optimizer`, in errors.
    """
    tables = {layout.table_name for members in stacks.values() for layout in members}
    if isinstance(optimizer, Mapping):
        unknown = sorted(set(optimizer) - tables)
        if unknown:
            raise ValueError(
                f"{argument} names tables {unknown} that the SparseCore layouts "
                f"do not have (tables: {sorted(tables)})."
            )
        missing = sorted(tables - set(optimizer))
        if missing:
            raise ValueError(
                f"{argument} has no optimizer for tables {missing}; give one "
                "per table or a single optimizer for all."
            )
        by_table = {
            name: definition_of(value, f"{argument} of table {name!r}")
            for name, value in optimizer.items()
        }
    else:
        definition = definition_of(optimizer, argument)
        by_table = {name: definition for name in tables}
    result = {}
    for stacked, members in stacks.items():
        found = {id(d): d for d in (by_table[t.table_name] for t in members)}
        if len(found) != 1:
            raise ValueError(
                f"Tables {[t.table_name for t in members]} share stacked table "
                f"{stacked!r}, so TPUEmbeddingV2 gave them one optimizer; "
                f"{argument} gives them {sorted(d.name for d in found.values())}."
            )
        result[stacked] = next(iter(found.values()))
    return result


def slot_names(definition: spec.Definition) -> List[str]:
    """The names of `definition`'s slots, in its order (TensorFlow's
    `_slot_names()`)."""
    return [slot.name for slot in definition.slots]
