"""What every engine's verdict is made of: settings, table and engine reports.

Each engine module (`tensorcore`, `sparsecore`, `jax_tpu_embedding`) judges
one embedding-face optimizer and returns a `TableReport`;
`tf_tpu_embed_opt.engines.check_configuration` assembles them into an `EngineReport`
for a whole configuration. Nothing here needs TensorFlow but the two
functions that recognize TensorFlow's optimizer classes.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    runtime_checkable,
)

from tf_tpu_embed_opt.definitions import registry, spec

__all__ = [
    "ENGINES",
    "EngineBehaviour",
    "Setting",
    "TableReport",
    "EngineReport",
    "check_engine_name",
    "check_preflight_arguments",
    "definition_or_none",
    "dispatch_definition",
    "learning_rate_text",
    "refuse_a_global_optimizer",
    "shared_name_refusals",
    "tables_of",
]

ENGINES = spec.ENGINES


def check_engine_name(engine: Any, function: str) -> spec.Engine:
    """The engine `engine` names (an `Engine` object, which equals its name);
    else a ValueError naming `function`."""
    return spec.engine_named(engine, function)


def check_preflight_arguments(
    strict: Any, num_partitions: Any, sparse_cores_per_partition: Any
) -> None:
    """`check_engine`'s checks of its arguments that every engine shares."""
    if not isinstance(strict, bool):
        raise TypeError(
            f"check_engine: argument `strict` must be True or False; received "
            f"{strict!r}."
        )
    for name, value in (
        ("num_partitions", num_partitions),
        ("sparse_cores_per_partition", sparse_cores_per_partition),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"check_engine: argument `{name}` must be a positive int; "
                f"received {value!r}."
            )


@dataclasses.dataclass(frozen=True)
class Setting:
    """One optimizer setting and what the engine does with it.

    Attributes:
      name: The embedding face's argument name (`clipvalue`, `lazy_adam`, ...).
      value: The value configured.
      verdict: `"passed"` (the engine receives it), `"dropped"` (silently not
        used), `"changed"` (a converter on the way, keras-rs, gives it another
        meaning) or `"rejected"` (the engine raises).
      reason: What happens instead, for a dropped or rejected setting.
      changes_math: Whether the engine then computes something else than the
        configuration says (False for a dropped setting that has no effect).
    """

    name: str
    value: Any
    verdict: str
    reason: str = ""
    changes_math: bool = True

    def describe(self) -> str:
        text = f"{self.name}={self.value!r}"
        return f"{text}: {self.reason}" if self.reason else text


@dataclasses.dataclass(frozen=True)
class TableReport:
    """What one engine does with one table's optimizer.

    Attributes:
      table: The table's name (`None` for a bare optimizer).
      optimizer: The optimizer checked (after keras-rs's conversion for a
        keras-rs table).
      algorithm: Its definition name (`None` if it is no optimizer this package
        knows).
      received: What the engine receives, in order: the op (SparseCore) and
        every setting passed on, by the embedding face's names.
      dropped: Settings the engine silently does not use or that reach it
        changed.
      rejected: Settings (or the optimizer) the engine refuses.
      stack: For `TPUEmbeddingV2`, the stacked table this table lives in.
      warnings: What can still fail or change the math at run time, though
        the configuration runs (e.g. a feature without gradient).
      custom: Why the engine runs the optimizer as a custom one rather than
        its own (jax-tpu-embedding: a `RuleOptimizerSpec` instead of its own
        spec), a setting and its reason each; empty where it runs its own.
    """

    table: Optional[str]
    optimizer: Any
    algorithm: Optional[str]
    received: Tuple[Tuple[str, Any], ...]
    dropped: Tuple[Setting, ...]
    rejected: Tuple[Setting, ...]
    stack: Optional[str] = None
    warnings: Tuple[str, ...] = ()
    custom: Tuple[str, ...] = ()

    def verdict(self, name: str) -> str:
        """What the engine does with the setting `name` (an argument name, or
        `"optimizer"` for the algorithm itself): `"passed"`, `"dropped"`,
        `"changed"` or `"rejected"`."""
        for setting in self.rejected + self.dropped:
            if setting.name == name:
                return setting.verdict
        return "passed"

    @property
    def problems(self) -> Tuple[Setting, ...]:
        """Rejected settings and dropped ones that change the math."""
        return self.rejected + tuple(s for s in self.dropped if s.changes_math)

    @property
    def runs(self) -> bool:
        """Whether the engine runs this table at all."""
        return not self.rejected

    @property
    def exact(self) -> bool:
        """Whether the engine computes exactly what the optimizer says."""
        return not self.problems

    def check_runs(self, refusal: str) -> None:
        """Raises where the engine refuses the table: a ValueError starting
        with `refusal` and listing what it refuses."""
        if not self.runs:
            refused = "; ".join(s.describe() for s in self.rejected)
            raise ValueError(f"{refusal}: {refused}.")


@dataclasses.dataclass(frozen=True)
class EngineReport:
    """The preflight of one configuration on one engine.

    Attributes:
      engine: The engine (`spec.Engine`, equal to its name: `"TPUEmbedding"`,
        `"TPUEmbeddingV2"` or `"jax-tpu-embedding"`; a name given is taken
        as its engine).
      tables: One report per table, in the order of first appearance.
      stacks: For `TPUEmbeddingV2` with features: stacked table -> its tables.
    """

    engine: spec.Engine
    tables: Tuple[TableReport, ...]
    stacks: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        engine = spec.engine_named(self.engine, "EngineReport")
        object.__setattr__(self, "engine", engine)

    @property
    def runs(self) -> bool:
        return all(t.runs for t in self.tables)

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tables)

    def table(self, name: Optional[str]) -> TableReport:
        """The report of the table named `name` (`None`: a bare optimizer's).

        Raises:
          KeyError: No table of the report has that name; the message lists
            those it has.
        """
        for report in self.tables:
            if report.table == name:
                return report
        raise KeyError(
            f"EngineReport.table: no table {name!r} in the report; its tables: "
            f"{[report.table for report in self.tables]}."
        )

    def problems(self) -> List[str]:
        """One line per rejected or math-changing dropped setting."""
        lines = []
        for report in self.tables:
            where = f"table {report.table!r}: " if report.table is not None else ""
            for setting in report.problems:
                lines.append(f"{where}{setting.verdict} {setting.describe()}")
        return lines

    def lines(self) -> List[str]:
        """A human-readable report, one line per fact."""
        out = [f"engine: {self.engine}"]
        for report in self.tables:
            name = report.table if report.table is not None else "(optimizer)"
            status = (
                "refused"
                if not report.runs
                else "exact"
                if report.exact
                else "runs, with different math"
            )
            out.append(f"table {name}: {report.algorithm or '?'} - {status}")
            if report.stack is not None:
                out.append(f"  stacked table: {report.stack}")
            for key, value in report.received:
                out.append(f"  receives {key} = {value}")
            for reason in report.custom:
                out.append(f"  custom, because {reason}")
            for setting in report.dropped:
                verb = "changes" if setting.verdict == "changed" else "drops"
                out.append(f"  {verb} {setting.describe()}")
            for setting in report.rejected:
                out.append(f"  refuses {setting.describe()}")
            for warning in report.warnings:
                out.append(f"  warns: {warning}")
        for stack, tables in self.stacks.items():
            if len(tables) > 1:
                out.append(f"stacked together in {stack}: {', '.join(tables)}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


@runtime_checkable
class EngineBehaviour(Protocol):
    """What one engine does, asked instead of its name: the protocol its
    module in `tf_tpu_embed_opt.engines` satisfies (`Engine.module`;
    `engines.behaviour_of` finds it; tests/test_registries.py checks each).

    Attributes:
      TITLE: Its column's title in the documentation's table of algorithms.
    """

    TITLE: str

    def algorithms(self) -> Tuple[str, ...]:
        """The definitions it runs (its own or a custom optimizer), by name,
        in the registry's order."""

    def runs_as(self, definition: spec.Definition) -> str:
        """How it runs `definition`, or that it does not and why, as the
        documentation's table says it."""

    def check_optimizer(self, opt: Any, table: Optional[str]) -> TableReport:
        """Its verdict on one table's optimizer, setting by setting."""

    def for_twin(self, opt: Any) -> Tuple[Any, Tuple[Setting, ...]]:
        """The embedding optimizer whose math the engine computes for `opt`
        (what a Keras twin must reproduce), and the settings it drops on the
        way.

        Raises:
          ValueError: The engine refuses `opt`; the message lists why.
        """


def learning_rate_text(rate: Any) -> str:
    if callable(rate):
        return f"{rate!r} (called at every apply_gradients)"
    return repr(rate)


def definition_or_none(opt: Any) -> Any:
    from tf_tpu_embed_opt.embedding import parameters as embedding

    try:
        return embedding.definition_of(opt)
    except TypeError:
        return None


def dispatch_definition(opt: Any) -> Any:
    """The definition `TPUEmbeddingV2.apply_gradients` treats `opt` as.

    It tests `isinstance` against TensorFlow's classes in this order, so any
    subclass of them (this package's or a user's) takes that branch.
    """
    from tensorflow.python.tpu import tpu_embedding_v2_utils

    definition = definition_or_none(opt)
    if definition is not None:
        return definition
    for name, definition in registry.BY_NAME.items():
        tf_class = getattr(tpu_embedding_v2_utils, name, None)
        if tf_class is not None and isinstance(opt, tf_class):
            return definition
    return None


def refuse_a_global_optimizer(obj: Any, optimizer: Any) -> None:
    """Refuses `check_engine`'s global `optimizer` beside an optimizer `obj`.

    Raises:
      ValueError: `optimizer` is not None: it has no table to apply to.
    """
    if optimizer is not None:
        raise ValueError(
            "check_engine: argument `optimizer` is the global optimizer of a "
            f"configuration's tables; `obj` is itself an optimizer "
            f"({type(obj).__name__}), "
            f"so the global one {optimizer!r} has no table to apply to."
        )


def shared_name_refusals(
    named: Sequence[Tuple[str, Any]], why: Callable[[str], str]
) -> Dict[int, Tuple[Setting, ...]]:
    """Table id -> the refusal of its name, for each of the `(name, table)`
    pairs whose name another pair has; `why(name)` says what the engine
    does with such tables."""
    counts = collections.Counter(name for name, _ in named)
    return {
        id(table): (
            Setting(
                "name",
                name,
                "rejected",
                f"another table is named {name!r} too: {why(name)}; give each "
                "table its own name",
            ),
        )
        for name, table in named
        if counts[name] > 1
    }


def tables_of(features: Sequence[Tuple[str, Any]]) -> List[Any]:
    """The features' tables, each once, in the order of first appearance."""
    tables: List[Any] = []
    for _, feature in features:
        if not any(feature.table is t for t in tables):
            tables.append(feature.table)
    return tables
