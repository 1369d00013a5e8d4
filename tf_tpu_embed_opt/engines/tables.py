"""Documentation tables of the engines, derived from the definitions.

docs/guides/sparsecore-keras-rs.md embeds them (tests/test_readme.py checks).
"""

from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.engines import behaviour_of

__all__ = ["availability_markdown"]


def availability_markdown() -> str:
    """Which algorithm runs on which engine, and as what: each engine says."""
    engines = [behaviour_of(engine) for engine in spec.ENGINES]
    rows = [
        "| Algorithm | " + " | ".join(e.TITLE for e in engines) + " |",
        "|---" * (1 + len(engines)) + "|",
    ]
    for d in registry.ALL:
        cells = " | ".join(e.runs_as(d) for e in engines)
        rows.append(f"| `{d.name}` | {cells} |")
    return "\n".join(rows) + "\n"
