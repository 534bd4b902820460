"""Declared parameters: one way to state, document and check the settings of every component.

Attacks, defenses, the training config and the threat model are frozen dataclasses. Each field
that a user can set is declared with `param`, which records what values it accepts (a `Kind`:
`Int`, `Number`, `Numbers`, `Choice`, `Flag`, `Text` or `Scalar`) and a line of documentation
in the field's metadata. The owner's ``__post_init__`` then calls `validate`, which checks every
declared field and raises `ConfigError` with a one-line message such as::

    attack dlg: iterations must be an integer in [1, 100000], got 1.5
    defense gaussian: sigma must be in [0, inf), got -1
    training.epochs must be an integer in [1, 10000], got 0

Owners word their messages slightly differently (how the parameter is named, how a range's
bounds are printed); a `Style` holds those differences, so that the messages users already
know stay exactly as they were. A renamed parameter keeps working under its old name through
an `Alias` (see `resolve_aliases`).

This module is a foundation: it imports only `leakbench.core.errors` and the standard library.

Example::

    @dataclasses.dataclass(frozen=True)
    class Blur:
        radius: int = param(1, Int(0, 8), doc="Pixels on each side of the kernel's centre.")

        def __post_init__(self) -> None:
            validate(self, "defense blur")
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from leakbench.core.errors import ConfigError

# The key of a declared field's metadata entry (a `Declared`).
METADATA_KEY = "leakbench.param"

# `param`'s default for a parameter without a default (it must then be given).
REQUIRED: Any = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Style:
    """How one owner's messages name a parameter and print a number's range.

    Attributes:
        joiner: What joins the owner and the parameter: ``": "`` gives ``attack dlg:
            iterations``, ``"."`` gives ``training.epochs``.
        number_format: Format spec for the bounds of a `Number`: ``""`` prints them with
            ``str`` (``1e-08``, ``10.0``), ``"g"`` in the short form (``1e-08``, ``10``).
            Bounds of an `Int` are always printed as plain integers.
        range_message: Whether a number of the right type that lies outside its range gets
            the shorter ``must be in [0, 1]`` (the defenses' wording) instead of the
            ``must be a number in [0, 1]`` that wrong types get.
    """

    joiner: str = ": "
    number_format: str = ""
    range_message: bool = False

    def label(self, where: str, name: str) -> str:
        """How a message names parameter ``name`` of the owner ``where``."""
        return f"{where}{self.joiner}{name}"


# The style of attacks (and of any owner that does not say otherwise).
PLAIN = Style()
# The style of config sections: "training.epochs must be ...", "threat_model.train_steps ...".
SECTION = Style(joiner=".")


def _refuse(label: str, allowed: str, value: Any) -> ConfigError:
    return ConfigError(f"{label} must be {allowed}, got {value!r}")


class Kind:
    """What values a parameter accepts. Subclasses implement `describe` and `check`."""

    def describe(self, style: Style = PLAIN) -> str:
        """The accepted values in words, as they follow "must be" in a message."""
        raise NotImplementedError

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        """Returns the value to store (``value`` itself or its normal form).

        Raises:
            ConfigError: ``value`` is not accepted; the message starts with ``label``.
        """
        raise NotImplementedError


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but true is not a number a user means to give.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Int(Kind):
    """An integer (never a bool) in ``[low, high]``; a bound of None is no bound."""

    low: int | None = None
    high: int | None = None

    def describe(self, style: Style = PLAIN) -> str:
        if self.low is None and self.high is None:
            return "an integer"
        if self.high is None:
            return f"an integer >= {self.low}"
        if self.low is None:
            return f"an integer <= {self.high}"
        return f"an integer in [{self.low}, {self.high}]"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (self.low is not None and value < self.low)
            or (self.high is not None and value > self.high)
        ):
            raise _refuse(label, self.describe(style), value)
        return value


@dataclasses.dataclass(frozen=True)
class Number(Kind):
    """A real number (an int or a float, never a bool) in an interval.

    Attributes:
        low: Lower bound, or None for none.
        high: Upper bound, or None for none.
        low_open: Whether ``low`` itself is excluded.
        high_open: Whether ``high`` itself is excluded.
        finite: Whether NaN and infinities are refused (they are never inside a range's
            comparisons, so refusing them up front keeps the message about the type).
        as_float: Whether the value is stored as a float, so that ``1`` and ``1.0`` give the
            same parameters (and the same canonical keys); otherwise it is stored as given.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = True
    as_float: bool = True

    def interval(self, style: Style = PLAIN) -> str:
        """The range in interval notation, e.g. ``[0, inf)``; an absent bound is open."""
        low = "-inf" if self.low is None else format(self.low, style.number_format)
        high = "inf" if self.high is None else format(self.high, style.number_format)
        opening = "(" if self.low_open or self.low is None else "["
        closing = ")" if self.high_open or self.high is None else "]"
        return f"{opening}{low}, {high}{closing}"

    def describe(self, style: Style = PLAIN) -> str:
        if self.low is None and self.high is None:
            return "a number"
        return f"a number in {self.interval(style)}"

    def contains(self, value: float) -> bool:
        """Whether the number ``value`` lies in the interval."""
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        if self.high is not None:
            return value < self.high if self.high_open else value <= self.high
        return True

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not _is_number(value) or (self.finite and not math.isfinite(value)):
            raise _refuse(label, self.describe(style), value)
        if not self.contains(value):
            if style.range_message:
                raise _refuse(label, f"in {self.interval(style)}", value)
            raise _refuse(label, self.describe(style), value)
        return float(value) if self.as_float else value


@dataclasses.dataclass(frozen=True)
class Numbers(Kind):
    """A list of ``low`` to ``high`` distinct numbers, each accepted by ``item``; stored as a
    tuple (so the owner stays hashable) of the values ``item`` stores."""

    item: Number
    low: int = 1
    high: int = 8

    def describe(self, style: Style = PLAIN) -> str:
        count = f"{self.low} to {self.high}" if self.low != self.high else str(self.low)
        return f"a list of {count} distinct numbers in {self.item.interval(style)}"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, (list, tuple)) or not self.low <= len(value) <= self.high:
            raise _refuse(label, self.describe(style), value)
        normal = []
        for entry in value:
            if not _is_number(entry) or not math.isfinite(entry) or not self.item.contains(entry):
                raise _refuse(label, self.describe(style), value)
            normal.append(float(entry) if self.item.as_float else entry)
        if len(set(normal)) != len(normal):
            raise _refuse(label, self.describe(style), value)
        return tuple(normal)


@dataclasses.dataclass(frozen=True, init=False)
class Choice(Kind):
    """One of a few fixed values (usually strings).

    Messages list the values as ``'a' or 'b'``, or as ``one of a, b`` with ``one_of=True``.
    """

    values: tuple[Any, ...]
    one_of: bool = False

    def __init__(self, *values: Any, one_of: bool = False) -> None:
        if not values:
            raise ValueError("a Choice needs at least one value")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "one_of", one_of)

    def describe(self, style: Style = PLAIN) -> str:
        if self.one_of:
            return "one of " + ", ".join(str(v) for v in self.values)
        return " or ".join(repr(v) for v in self.values)

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if value not in self.values:
            raise _refuse(label, self.describe(style), value)
        return value


@dataclasses.dataclass(frozen=True)
class Registered(Kind):
    """A name in a registry (`leakbench.core.registry.Registry`), plugins included: the names
    allowed are read when a value is checked, so an installed plugin's name is accepted."""

    registry: Any

    def describe(self, style: Style = PLAIN) -> str:
        return f"a registered {self.registry.kind}: one of " + ", ".join(self.registry.names())

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if isinstance(value, str) and value not in self.registry:
            if value in self.registry.broken():
                self.registry.get(value)  # raises the plugin's own one-line error
        if not isinstance(value, str) or value not in self.registry:
            raise _refuse(label, self.describe(style), value)
        return value


@dataclasses.dataclass(frozen=True)
class Flag(Kind):
    """A bool (``true`` or ``false`` in TOML); numbers are refused."""

    def describe(self, style: Style = PLAIN) -> str:
        return "true or false"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, bool):
            raise _refuse(label, self.describe(style), value)
        return value


@dataclasses.dataclass(frozen=True)
class Text(Kind):
    """A string."""

    def describe(self, style: Style = PLAIN) -> str:
        return "a string"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, str):
            raise _refuse(label, self.describe(style), value)
        return value


# Exactly the JSON scalars (a numpy float, say, is refused), so that parameters stay canonical.
_SCALAR_TYPES = (bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Scalar(Kind):
    """Any JSON scalar (a bool, an int, a float or a string) or None."""

    def describe(self, style: Style = PLAIN) -> str:
        return "a number, a string, true or false"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if value is not None and type(value) not in _SCALAR_TYPES:
            raise _refuse(label, self.describe(style), value)
        return value


@dataclasses.dataclass(frozen=True)
class Declared:
    """What `param` stores in a field's metadata."""

    kind: Kind
    doc: str = ""
    keyed_when_set: bool = False


def param(default: Any, kind: Kind, *, doc: str = "", keyed_when_set: bool = False) -> Any:
    """A dataclass field declared as a parameter of ``kind``.

    Args:
        default: The default value, or `REQUIRED` for a parameter that must be given.
        kind: What values the parameter accepts.
        doc: One line on what the parameter means (``leakbench list`` may show it).
        keyed_when_set: For a parameter added after trial keys existed: it is part of the
            component's parameters (and so of its trial keys, tables and resolved configs) only
            when it differs from its default, so that runs made before it keep their keys.

    Returns:
        A ``dataclasses.field`` carrying the declaration in its metadata.
    """
    declaration = Declared(kind, doc, keyed_when_set)
    return dataclasses.field(default=default, metadata={METADATA_KEY: declaration})


def keyed_when_set(cls_or_obj: Any) -> frozenset[str]:
    """The parameters of a component class (or instance) declared ``keyed_when_set``."""
    return frozenset(f.name for f, d in declared(cls_or_obj) if d.keyed_when_set)


def keyed_params(obj: Any) -> dict[str, Any]:
    """A component's parameters as its keys hold them: every field, but a ``keyed_when_set``
    parameter only when it differs from its default."""
    values = dataclasses.asdict(obj)
    defaults = {f.name: f.default for f in dataclasses.fields(obj)}
    late = keyed_when_set(obj)
    return {k: v for k, v in values.items() if k not in late or v != defaults[k]}


def declared(cls_or_obj: Any) -> Iterator[tuple[dataclasses.Field[Any], Declared]]:
    """The declared fields of a dataclass (class or instance), in field order."""
    for field in dataclasses.fields(cls_or_obj):
        declaration = field.metadata.get(METADATA_KEY)
        if declaration is not None:
            yield field, declaration


def check(value: Any, kind: Kind, where: str, name: str, style: Style = PLAIN) -> Any:
    """Checks one value that is not a field (e.g. a method's argument) like `validate` would.

    Returns:
        The value to use (see `Kind.check`).

    Raises:
        ConfigError: ``value`` is not accepted.
    """
    return kind.check(value, style.label(where, name), style)


def validate(obj: Any, where: str, style: Style = PLAIN) -> None:
    """Checks every declared field of the dataclass instance ``obj``, in field order.

    A value's normal form (e.g. ``1`` stored as ``1.0`` by a `Number`) replaces it, also on a
    frozen dataclass, so call this from ``__post_init__``.

    Args:
        obj: The instance.
        where: Who owns the parameters, as messages name it (``"attack dlg"``, ``"training"``).
        style: How the owner's messages are worded.

    Raises:
        ConfigError: For the first field whose value is not accepted.
    """
    for field, declaration in declared(obj):
        value = getattr(obj, field.name)
        normal = declaration.kind.check(value, style.label(where, field.name), style)
        if normal is not value:
            object.__setattr__(obj, field.name, normal)


def build(cls: type, where: str, params: Mapping[str, Any]) -> Any:
    """``cls(**params)`` for a component class, after refusing an unknown or a missing
    parameter in one line that names ``where`` (``"attack dlg"``) and what is allowed; the
    class's own ``__post_init__`` then checks the values."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    unknown = sorted(set(params) - names)
    if unknown:
        allowed = ", ".join(sorted(names)) or "none"
        raise ConfigError(f"{where}: unknown parameter {unknown[0]!r}; allowed: {allowed}")
    missing = sorted(
        f.name
        for f in fields
        if f.name not in params
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"{where}: parameter {missing[0]!r} is required")
    return cls(**params)


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Alias:
    """An old parameter name that still works: ``old = v`` means ``new = convert(v)``.

    Attributes:
        old: The deprecated name.
        new: The parameter's current name.
        kind: What values the old name accepts (checked before converting, so that a message
            about a bad value names the parameter the user wrote).
        convert: Maps an old value to the new parameter's value.
        hint: How to rewrite, shown in the deprecation notice, e.g. ``"same meaning"``.
    """

    old: str
    new: str
    kind: Kind
    convert: Callable[[Any], Any] = _same
    hint: str = "same meaning"


def aliases_of(cls: type) -> tuple[Alias, ...]:
    """The aliases that apply to the dataclass ``cls``: its ``aliases`` attribute, less any
    whose old name is a field of ``cls`` (a subclass, e.g. a plugin's, that declares a
    parameter of that name means its own parameter)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return tuple(alias for alias in getattr(cls, "aliases", ()) if alias.old not in names)


def rename_aliases(params: Mapping[str, Any], aliases: Sequence[Alias]) -> dict[str, Any]:
    """``params`` with old names replaced by new ones, quietly and without checks.

    For reading records written before a rename (e.g. stored parameters), never for input.
    """
    out = dict(params)
    for alias in aliases:
        if alias.old in out and alias.new not in out:
            out[alias.new] = alias.convert(out.pop(alias.old))
    return out


def resolve_aliases(
    params: Mapping[str, Any],
    aliases: Sequence[Alias],
    where: str,
    style: Style = PLAIN,
    *,
    sweeps: bool = False,
    stacklevel: int = 1,
) -> dict[str, Any]:
    """``params`` with each old name a user gave replaced by its new name.

    Each old name that is used is checked, then announced with one ``FutureWarning`` (one
    line: ``attack dlg: 'restarts' is deprecated; use 'retries' (same meaning)``).

    Args:
        params: The parameters as given.
        aliases: The owner's aliases.
        where: The owner, as messages name it.
        style: How the owner's messages are worded.
        sweeps: Whether a list value is a sweep of values (as in config files), each of which
            is checked and converted on its own.
        stacklevel: Which frame the warning points at: 1 is the caller of this function, 2
            its caller, and so on (as for ``warnings.warn``).

    Returns:
        A new dict; ``params`` is not changed.

    Raises:
        ConfigError: Both an old name and its new name are given, or an old name's value is
            not accepted (the message names the old name).
    """
    out = dict(params)
    for alias in aliases:
        if alias.old not in out:
            continue
        label = style.label(where, alias.old)
        if alias.new in out:
            raise ConfigError(
                f"{label} cannot be given together with {alias.new} (its new name); "
                f"give only {alias.new}"
            )
        value = out.pop(alias.old)
        if sweeps and isinstance(value, list):
            out[alias.new] = [alias.convert(alias.kind.check(v, label, style)) for v in value]
        else:
            out[alias.new] = alias.convert(alias.kind.check(value, label, style))
        # Warned only once the value is accepted: a refused value gets its error alone.
        warnings.warn(
            f"{where}{style.joiner}{alias.old!r} is deprecated; use {alias.new!r} ({alias.hint})",
            FutureWarning,
            stacklevel=stacklevel + 1,
        )
    return out
