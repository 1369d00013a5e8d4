"""How an algorithm appears as a Keras 3 optimizer: its class and arguments.

`KerasFace` and `KerasArg` are parts of a `spec.Definition` (re-exported by
`spec`, where the definitions' modules read them). An argument that is an
engine hyperparameter inherits from it what it does not say (`INHERITED`).
Imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

from tf_tpu_embed_opt.definitions.engine_faces import Remap
from tf_tpu_embed_opt.definitions.values import (
    Bounds,
    check_bool,
    check_real,
    is_real,
)

__all__ = ["INHERITED", "KerasArg", "KerasFace"]


class _Inherited:
    """What a `KerasArg` leaves to its hyperparameter."""

    def __repr__(self) -> str:
        return "INHERITED"


INHERITED: Any = _Inherited()


@dataclasses.dataclass(frozen=True)
class KerasArg:
    """An argument of an algorithm's Keras class.

    An argument that is an engine hyperparameter (`hyper`) inherits from it
    whatever it does not say itself: its name, default, kind, doc and bounds
    (`KerasArg(hyper="beta")` is the hyperparameter `beta` on the Keras face);
    its definition fills them in (`Definition.keras_arguments`).

    Attributes:
      name: The Keras argument name (e.g. `nesterov`, `lazy`).
      default: Its default on the Keras face (Keras's own where Keras has the
        algorithm).
      kind: `"float"` or `"bool"`.
      doc: One-line description.
      bounds: Allowed interval for a float (where the Keras face's domain is
        wider than the TensorFlow engines', the values another engine or
        Keras accepts and computes; a conversion to the embedding face then
        refuses the rest with TensorFlow's reason).
      hyper: The engine hyperparameter with the same meaning, whose value is
        copied by the conversions; `None` for a Keras-only argument.
      engine: For a Keras-only argument, the value with which the Keras math is
        the engine's (e.g. Adagrad `epsilon=0.0`). A conversion to the
        embedding face refuses any other value.
      keyword: Taken through `**kwargs`, so that the explicit signature stays
        exactly Keras's (TPU-only options such as `lazy`).
      keras_error: Keras's own message for a value outside `bounds`, where
        Keras checks the argument (`{value}` is replaced by the value): the
        Keras-named classes refuse what Keras refuses with Keras's words, so
        that code matching Keras's errors keeps working.
      engine_lacks: For a Keras-only argument, why a value other than
        `engine` has no engine equivalent (the conversions' refusal says it).
      negligible: For a Keras-only argument, f(value, arguments) -> whether
        that value differs from `engine` by a documented, provably negligible
        amount with these Keras arguments (Adagrad's epsilon far below the
        initial accumulator): the conversions then take it as `engine`.
      in_learning_rate: A value other than `engine` is carried by the
        conversions' learning rate (Adam's `bias_correction`: the
        definition's `KerasFace.learning_rate_factor`, evaluated at the Keras
        optimizer's step), not refused.
    """

    name: str = INHERITED
    default: Any = INHERITED
    kind: str = INHERITED
    doc: str = INHERITED
    bounds: Optional[Bounds] = INHERITED
    hyper: Optional[str] = None
    engine: Any = None
    keyword: bool = False
    keras_error: Optional[str] = None
    engine_lacks: str = "the engine has no such option"
    negligible: Optional[Callable[[Any, Mapping[str, Any]], bool]] = None
    in_learning_rate: bool = False

    def check(self, owner: str, value: Any) -> None:
        if self.kind == "bool":
            check_bool(owner, self.name, value)
            return
        if (
            self.keras_error is not None
            and is_real(value)
            and not (self.bounds is None or self.bounds.contains(value))
        ):
            raise ValueError(self.keras_error.format(value=value))
        check_real(owner, self.name, value, self.bounds)

    @classmethod
    def mirroring(cls, hyper: Any, bounds: Optional[Bounds] = None) -> "KerasArg":
        """The Keras argument equal to an engine hyperparameter (`bounds`, where
        given, the Keras face's wider domain)."""
        return cls(hyper=hyper.name, bounds=INHERITED if bounds is None else bounds)

    def inheriting(self, hypers: Mapping[str, Any], owner: str) -> "KerasArg":
        """This argument with what it does not say taken from its `hyper`.

        Raises:
          ValueError: It names no hyperparameter of `hypers` yet leaves a
            field to inherit.
        """
        unsaid = [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is INHERITED
        ]
        if self.hyper is None and unsaid == ["bounds"]:
            return dataclasses.replace(self, bounds=None)  # Keras-only: none
        if not unsaid:
            return self
        hyper = hypers.get(self.hyper) if self.hyper is not None else None
        if hyper is None:
            # An argument that inherits its name too has none to show.
            which = "a" if self.name is INHERITED else f"{self.name!r}, a"
            raise ValueError(
                f"Definition {owner}: {which} Keras argument, leaves {unsaid} "
                "to inherit, but names no hyperparameter of it "
                f"(hyper={self.hyper!r}; it has {sorted(hypers)})."
            )
        inherited = {
            "name": hyper.name,
            "default": hyper.default,
            "kind": hyper.kind,
            "doc": hyper.doc,
            "bounds": hyper.bounds,
        }
        return dataclasses.replace(self, **{name: inherited[name] for name in unsaid})


@dataclasses.dataclass(frozen=True)
class KerasFace:
    """How an algorithm appears as a Keras 3 optimizer.

    Attributes:
      name: Class name in `tf_tpu_embed_opt.optimizers` (Keras's name where
        Keras has the algorithm: `Ftrl`, `RMSprop`).
      learning_rate: Default learning rate on the Keras face; `INHERITED`
        (the default): the embedding face's (`Definition.learning_rate_default`),
        which its `Definition` fills in.
      arguments: The algorithm's Keras arguments, in signature order; those with
        `keyword=True` come through `**kwargs`. `None`: the engine's
        hyperparameters, same names and defaults (no Keras class to follow).
      extra_slots: Keras-only slots; their `when` says when they exist.
      slots_by_variable: Whether Keras's class builds the algorithm's own
        slots variable by variable (one `add_optimizer_variables` call with
        every slot's name: Adam's momentum and velocity, Ftrl, Adadelta)
        rather than slot by slot (RMSprop, whose slots each depend on an
        argument). The twin builds them in the same order, so that the
        variables Keras saves by position (`save_own_variables`,
        `.weights.h5`) are where Keras's class has them; `extra_slots`
        follow, slot by slot, as Keras adds them.
      stock: Name of the `keras.optimizers` class with the same signature and,
        on dense gradients, the same math; `None` if Keras has none.
      variants: Keras bool arguments that switch to another engine algorithm
        (by definition name) when True: RMSprop's `centered`.
      learning_rate_factor: Optional f(xp, step, arguments, lr) giving the
        learning rate of step `step` (1-based) from `lr`; Keras Adam's bias
        correction.
      zero_gradient_steps: Whether, with the given Keras arguments, the step
        with a zero gradient changes the weights or a slot the next steps read
        (momentum, moving averages, FTRL's weights recomputed from `linear`).
        Keras then changes every row on a sparse gradient, the engine only
        the looked-up rows; the class takes `lazy` to choose (see `lazy`).
        `None`: never (Adagrad); the class takes no `lazy`.
      lazy_hyper: The engine hyperparameter that `lazy` sets, if the engine
        has the choice too (Adam's `lazy_adam`).
      zero_gradient_keeps_weights: Whether, with the given Keras arguments,
        the zero-gradient step leaves the weights exactly as they are (only
        slots change: RMSprop without momentum, Adadelta). With `lazy=False`
        a sparse gradient then steps every row's slots but writes only the
        looked-up rows of the weights, as Keras does. `None`: never.
      check: Optional cross-argument validation of the Keras arguments,
        called with the class name and the arguments by name.
      remap: Keras arguments under which the conversions give another
        engine algorithm (`Remap`), or `None`.
      engine_options: Whether the class takes the engine options every twin
        takes (`configured.ENGINE_OPTIONS`: weight and gradient clipping,
        row-wise weight decay, `rounding`); False for an algorithm that no
        engine runs and whose source has no such options.
      learning_rate_check: Optional f(owner, value) -> the learning rate to
        use, raising for a value the class refuses, where the class follows
        another source than Keras 3 (one that takes any real number >= 0);
        `None`: Keras's (a float, a schedule or a callable).
      name_default: The default of the class's `name` where it follows
        another source than Keras 3 (whose classes' default is their name);
        `None`: as Keras's class of the same name, or Keras's default.
    """

    name: str
    learning_rate: float = INHERITED
    arguments: Optional[Tuple[KerasArg, ...]] = None
    extra_slots: Tuple[Any, ...] = ()
    slots_by_variable: bool = False
    stock: Optional[str] = None
    variants: Mapping[str, str] = dataclasses.field(default_factory=dict)
    learning_rate_factor: Optional[Callable[..., Any]] = None
    zero_gradient_steps: Optional[Callable[[Mapping[str, Any]], bool]] = None
    lazy_hyper: Optional[str] = None
    zero_gradient_keeps_weights: Optional[Callable[[Mapping[str, Any]], bool]] = None
    check: Optional[Callable[[str, Mapping[str, Any]], None]] = None
    remap: Optional[Remap] = None
    engine_options: bool = True
    learning_rate_check: Optional[Callable[[str, Any], Any]] = None
    name_default: Optional[str] = None

    @property
    def lazy(self) -> Optional[KerasArg]:
        """The `lazy` argument, derived from `zero_gradient_steps` and `stock`.

        One rule for every class whose zero-gradient step can change a row;
        `None` for the others (they update only looked-up rows either way). A
        class named like Keras's (`stock`) defaults to Keras's result
        (`lazy=False`: every row steps on a sparse gradient, as with the
        equivalent dense gradient); an engine-only class to the engine's
        (`lazy=True`: only looked-up rows and their slots change).
        """
        if self.zero_gradient_steps is None:
            return None
        return KerasArg(
            "lazy",
            self.stock is None,
            "bool",
            "With a sparse gradient, update only the looked-up rows and their "
            "slots (the TPU engine's rule); False: every row steps, as with the "
            "equivalent dense gradient (Keras's rule).",
            hyper=self.lazy_hyper,
            engine=None if self.lazy_hyper else True,
            keyword=True,
        )
