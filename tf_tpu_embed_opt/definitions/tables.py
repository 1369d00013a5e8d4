"""Documentation tables derived from the definitions.

docs/optimizers.md and docs/guides/sparsecore-keras-rs.md embed them.
"""

from tf_tpu_embed_opt.definitions import registry

__all__ = [
    "embedding_optimizers_markdown",
    "conversions_markdown",
    "jax_engine_markdown",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def embedding_optimizers_markdown() -> str:
    """The table of embedding optimizers, slots and update rules."""
    rows = [
        "| Class | Engine proto | TensorFlow class | Slots (initial value) | Update |",
        "|---|---|---|---|---|",
    ]
    for d in registry.DEFINITIONS:
        slots = ", ".join(f"`{s.name}` ({s.initial})" for s in d.slots) or "none"
        if d.tensorflow_class:
            tf_class = f"`{d.tensorflow_class}`"
        else:
            tf_class = "none (ops only)"
        rows.append(
            f"| `{d.name}` | `{d.proto_oneof}` | {tf_class} | {slots} | "
            f"{_cell(d.math)} |"
        )
    return "\n".join(rows) + "\n"


def conversions_markdown() -> str:
    """The table of Keras twins and how they convert."""
    rows = [
        "| Keras twin | Same as | Embedding class | Keras-only settings "
        "(must be at this value to convert) |",
        "|---|---|---|---|",
    ]
    for d in registry.DEFINITIONS:
        if d.keras is None:
            continue
        stock = f"`keras.optimizers.{d.keras.stock}`" if d.keras.stock else "none"
        targets = [f"`{d.name}`"] + [
            f"`{variant}` ({flag}=True)" for flag, variant in d.keras.variants.items()
        ]
        keras_only = ", ".join(
            f"`{a.name}={a.engine!r}`"
            for a in d.keras_arguments
            if a.hyper is None and a.name not in d.keras.variants
        )
        rows.append(
            f"| `{d.keras.name}` | {stock} | {', '.join(targets)} | "
            f"{keras_only or 'none'} |"
        )
    return "\n".join(rows) + "\n"


def jax_engine_markdown() -> str:
    """The table of jax-tpu-embedding's specs and their twins."""
    rows = [
        "| jax-tpu-embedding spec | Keras twin | Spec fields (twin argument) | "
        "The twin's settings the spec implies | Slots |",
        "|---|---|---|---|---|",
    ]
    for d in registry.ALL:
        if d.jax is None:
            continue
        fields = ", ".join(
            f"`{field}`" if field == name else f"`{field}` (`{name}`)"
            for name, field in d.jax.fields.items()
        )
        implied = ", ".join(f"`{k}={v!r}`" for k, v in d.jax.implied.items())
        slots = ", ".join(f"`{s}`" for s in d.jax_slots.values()) or "none"
        rows.append(
            f"| `{d.jax.spec_class}` | `{d.keras.name}` | {fields or 'none'} | "
            f"{implied or 'none'} | {slots} |"
        )
    return "\n".join(rows) + "\n"
