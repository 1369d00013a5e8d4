"""Documentation tables derived from the definitions (the README embeds them)."""

from tf_tpu_embed_opt import registry

__all__ = ["embedding_optimizers_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def embedding_optimizers_markdown() -> str:
    """The README's table of embedding optimizers, slots and update rules."""
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
