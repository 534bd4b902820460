"""What leakbench ships, readable without importing TensorFlow: the built-in datasets, models,
attacks, priors and defenses with their modalities, one-line summaries and declared parameters,
the config's top-level keys and sections, and the standard suite.

The catalogue is a file, ``catalogue.json`` beside this module, written from the live
registries by ``python -m leakbench.run.listing --write``; a test keeps the two equal, so an
attack or a parameter added without rewriting it fails the tests. Importing TensorFlow takes
several seconds, and two things need none of it: ``leakbench list`` (`render`), and refusing a
malformed config before a run starts (`leakbench.run.precheck`). Both use the file only when no
plugin is installed (`plugins_installed`); a plugin's components are known only by importing
it, and the command then takes the path through the registries.

A parameter's kind (`leakbench.core.params`) is stored as data (`kind_to_json`) when it is one
of the plain kinds, and rebuilt by `kind_from_json`; any other kind is stored as None and is
checked only once the registries are loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import Any

from leakbench.core.errors import ConfigError
from leakbench.core.params import (
    PLAIN,
    Choice,
    Flag,
    Int,
    Kind,
    Number,
    Numbers,
    Scalar,
    Style,
    Text,
)
from leakbench.core.plugins import ENTRY_POINT_GROUPS

# The format of ``catalogue.json``; a reader refuses another.
FORMAT = 1
FILE = files("leakbench.core") / "catalogue.json"
# The width of a name's column in `leakbench list`.
NAME_WIDTH = 14
_INDENT = f"\n  {'':{NAME_WIDTH}} "


def plugins_installed() -> bool:
    """Whether an installed distribution declares an entry point of a leakbench group (read from
    the packages' metadata, importing none of them)."""
    return any(importlib.metadata.entry_points(group=group) for group in ENTRY_POINT_GROUPS)


@functools.cache
def load() -> dict[str, Any]:
    """The shipped catalogue (read once per process).

    Raises:
        ValueError: The file is of another `FORMAT` (a broken installation).
    """
    data = json.loads(FILE.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{FILE}: catalogue format {data.get('format')!r}, expected {FORMAT}")
    return data


_PLAIN_KINDS: dict[str, type[Kind]] = {
    k.__name__: k for k in (Int, Number, Numbers, Choice, Flag, Text, Scalar)
}


def kind_to_json(kind: Kind) -> dict[str, Any] | None:
    """A plain kind as data (its class name and fields), the name of the registry of a
    `leakbench.core.params.Registered`, or None for any other kind."""
    name = type(kind).__name__
    if name == "Registered":
        return {"type": name, "registry": kind.registry.kind}  # type: ignore[attr-defined]
    if _PLAIN_KINDS.get(name) is not type(kind):
        return None
    if isinstance(kind, Choice):
        return {"type": name, "values": list(kind.values), "one_of": kind.one_of}
    fields = {f.name: getattr(kind, f.name) for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    if isinstance(kind, Numbers):
        fields["item"] = kind_to_json(kind.item)
    return {"type": name, **fields}


def kind_from_json(data: Mapping[str, Any] | None, names: Mapping[str, Sequence[str]]) -> Kind:
    """The kind `kind_to_json` stored; a registry's names are those of ``names`` (its kind ->
    its names). None (a kind stored as none) accepts anything: it is checked later."""
    if data is None:
        return _Later()
    fields = {k: v for k, v in data.items() if k != "type"}
    if data["type"] == "Registered":
        return _Names(fields["registry"], tuple(names.get(fields["registry"], ())))
    if data["type"] == "Choice":
        return Choice(*fields["values"], one_of=fields["one_of"])
    if data["type"] == "Numbers":
        fields["item"] = kind_from_json(fields["item"], names)
    return _PLAIN_KINDS[data["type"]](**fields)


@dataclasses.dataclass(frozen=True)
class _Later(Kind):
    """A kind the catalogue does not hold: every value passes here."""

    def describe(self, style: Style = PLAIN) -> str:
        return "a value checked when the run is built"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        return value


@dataclasses.dataclass(frozen=True)
class _Names(Kind):
    """A name of a registry, in the words of `leakbench.core.params.Registered`."""

    kind: str
    names: tuple[str, ...]

    def describe(self, style: Style = PLAIN) -> str:
        return f"a registered {self.kind}: one of " + ", ".join(self.names)

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, str) or value not in self.names:
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        return value


def style_of(data: Mapping[str, Any]) -> Style:
    """The `Style` a catalogue entry stores."""
    return Style(**data)


def render(catalogue: Mapping[str, Any]) -> str:
    """The text of ``leakbench list`` for ``catalogue`` (the shipped one, or one built from the
    registries with their plugins by `leakbench.run.listing.build`)."""
    lines = ["datasets:"]
    lines += [_row(e["name"], e) for e in catalogue["datasets"]]
    lines += [_row(e["name"] + ":PATH", e) for e in catalogue["file_sources"]]
    lines.append("models:")
    lines += [_row(e["name"], e) for e in catalogue["models"]]
    # Every modality's attacks, each with its modality (a run takes its dataset's).
    lines.append("attacks:")
    for entry in catalogue["attacks"]:
        lines += [_row(entry["name"], entry), f"  {'':{NAME_WIDTH}} {_params(entry)}"]
    for kind in ("priors", "defenses"):
        lines.append(f"{kind}:")
        for entry in catalogue[kind]:
            lines.append(_row(entry["name"], entry, modality=False) + _INDENT + _params(entry))
            if entry.get("adaptive"):
                settings = "; ".join(entry["adaptive"])
                lines.append(
                    f"  {'':{NAME_WIDTH}} adaptive attacks (applied to every family): {settings}"
                )
    lines += _suites(catalogue["suite"])
    return "\n".join(lines)


def _row(name: str, entry: Mapping[str, Any], modality: bool = True) -> str:
    """A component's line: its name, its modality in brackets, its summary."""
    kind = f"[{entry['modality']}] " if modality else ""
    return f"  {name:{NAME_WIDTH}} {kind}{entry['summary']}"


def _params(entry: Mapping[str, Any]) -> str:
    """One line per parameter: its default, then what it accepts and what it means when it is
    declared."""
    return _INDENT.join(p["line"] for p in entry["params"]) or "no parameters"


def _suites(suite: Mapping[str, Any]) -> list[str]:
    pad = f"  {'':{NAME_WIDTH}}"
    return [
        "suites:",
        f"  {'standard':{NAME_WIDTH}} protocol {suite['protocol']} (the default): the families "
        f"{', '.join(suite['families'])} untuned against every defense,",
        f"{pad} each with the defense's adaptive attacks; every one also against none, where "
        "it must",
        f"{pad} break it to vouch for a holds",
        f"  {'listed':{NAME_WIDTH}} only the attacks the config lists (and their adaptive "
        "variants); verdicts other",
        f"{pad} than a leak are untested",
    ]
