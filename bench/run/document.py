"""A config as a document: its TOML read with a bound on nesting, ``--set`` applied, and its
relative paths resolved and checked. Nothing here imports TensorFlow, so the command line can
refuse a malformed config at once (`leakbench.run.precheck`); `leakbench.run.config` builds the
run from the document this gives (`read_document`).
"""

from __future__ import annotations

import copy
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import tomli_w

from leakbench.components.saved_models import is_saved_model
from leakbench.core.errors import ConfigError
from leakbench.core.sources import source_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The built-in benchmark, shipped as package data: what a config of None reads.
DEFAULT_CONFIG_FILE = files("leakbench.run") / "default.toml"


def read_document(
    path: str | Path | None, settings: Sequence[str] = (), plugins: Sequence[str] = ()
) -> dict[str, Any]:
    """The config document of `leakbench.run.config.load_config` (which see): the file's TOML
    (``None``: the built-in default), its relative paths resolved against its folder, then
    ``settings`` and ``plugins`` applied (theirs against the working directory).

    Raises:
        ConfigError: One line naming what cannot be read, or a relative path that names
            nothing (with the path it was resolved to).
    """
    written: dict[str, str] = {}  # a relative path of the file as resolved -> as written
    if path is None:
        source, text = str(DEFAULT_CONFIG_FILE), DEFAULT_CONFIG_FILE.read_text(encoding="utf-8")
        doc = toml_document(text, source)
    else:
        source, text = read_config(Path(path))
        doc, written = _from_folder(toml_document(text, source), Path(path).parent)
    doc = with_settings(doc, settings)
    # Checked once the settings are in: a file's path that a setting replaced is not needed.
    _map_paths(doc, lambda label, kind, value: _exists(label, kind, value, written))
    doc = resolve_paths(doc, Path.cwd(), _GIVEN)  # the settings' (the file's are found)
    if plugins:
        given = resolve_paths({"plugins": list(plugins)}, Path.cwd(), _GIVEN)["plugins"]
        held = doc.get("plugins", [])
        doc["plugins"] = [*held, *given] if isinstance(held, list) else held
    return doc


def read_config(path: Path) -> tuple[str, str]:
    try:
        return str(path), path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} cannot be read: {err}") from None


# What a relative path of a config was resolved against, as `resolve_paths`'s errors say it.
_IN_FILE = "a relative path in a config file is resolved against the config's folder"
_GIVEN = "a relative path given on the command line is resolved against the working directory"


def resolve_paths(
    doc: Mapping[str, Any], base: Path, rule: str = _IN_FILE, *, check: bool = True
) -> dict[str, Any]:
    """``doc`` (a config document) with each relative path it names resolved against ``base``:
    a dataset's PATH (`leakbench.core.sources.PATH_SOURCES`), a saved model's
    (``keras:PATH``, as ``model`` and among ``threat_model.checkpoints``) and a plugin file
    (``*.py``). Each is written as a run records it, relative to the working directory (the
    meaning of a relative path in a run's ``config.toml``, which the workers, ``rescore``,
    ``merge`` and the board read), so that a config run from its own folder resolves to the
    text it always did. An absolute path, or one starting with ``~``, is kept as written, and a
    value of the wrong type is left to `build_run`'s checks.

    Raises:
        ConfigError: With ``check``, a relative path that names nothing: one line with the path
            it was resolved to and ``rule`` (what it was resolved against).
    """

    def resolve(label: str, kind: str, value: Any) -> Any:
        return _resolved(label, kind, value, base, rule, check)

    return _map_paths(doc, resolve)


def _from_folder(doc: Mapping[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """`resolve_paths` of a config file's document against its ``folder``, unchecked, and what
    each resolved value was written as (checked by `_exists` once the settings are in)."""
    written: dict[str, str] = {}

    def resolve(label: str, kind: str, value: Any) -> Any:
        new = _resolved(label, kind, value, folder, _IN_FILE, False)
        if new is not value:
            written[new] = value
        return new

    return _map_paths(doc, resolve), written


def _map_paths(doc: Mapping[str, Any], change: Callable[[str, str, Any], Any]) -> dict[str, Any]:
    """``doc`` with ``change(label, kind, value)`` applied to each value that may name a path:
    ``dataset`` and ``model``, each of ``plugins`` and of ``threat_model.checkpoints`` (kinds
    ``"dataset"``, ``"model"``, ``"plugin"``)."""
    out = dict(doc)
    for key in ("dataset", "model"):
        if key in out:
            out[key] = change(key, key, out[key])
    if isinstance(out.get("plugins"), list):
        out["plugins"] = [change(f"plugins[{i}]", "plugin", v)
                          for i, v in enumerate(out["plugins"])]  # fmt: skip
    threat = out.get("threat_model")
    if isinstance(threat, dict) and isinstance(threat.get("checkpoints"), list):
        points = [change(f"threat_model.checkpoints[{i}]", "model", v)
                  for i, v in enumerate(threat["checkpoints"])]  # fmt: skip
        out["threat_model"] = {**threat, "checkpoints": points}
    return out


def _resolved(label: str, kind: str, value: Any, base: Path, rule: str, check: bool) -> Any:
    """``value`` with its relative path resolved against ``base``, written as a run records it:
    relative to the working directory (`resolve_paths`)."""
    split = _path_of(kind, value)
    if split is None:
        return value
    prefix, path = split
    if not path or path.startswith("~") or Path(path).is_absolute():
        return value
    absolute = os.path.abspath(base / path)
    if check and not os.path.exists(absolute):
        raise ConfigError(f"{label} {value}: {absolute} does not exist ({rule})")
    here = os.getcwd()
    if os.path.realpath(base) == os.path.realpath(here):
        return value  # the working directory's already: kept as written
    try:
        return prefix + os.path.relpath(absolute, here)
    except ValueError:  # on another drive than the working directory (Windows)
        return prefix + absolute


def _exists(label: str, kind: str, value: Any, written: Mapping[str, str]) -> Any:
    """Refuses ``value`` if a config file wrote it as a relative path that names nothing."""
    split = _path_of(kind, value)
    if split is not None and value in written and not os.path.exists(split[1]):
        absolute = os.path.abspath(split[1])
        raise ConfigError(f"{label} {written[value]}: {absolute} does not exist ({_IN_FILE})")
    return value


def _path_of(kind: str, value: Any) -> tuple[str, str] | None:
    """``(PREFIX:, PATH)`` of a value of ``kind`` (``"dataset"``, ``"model"``, ``"plugin"``)
    that names a file or folder, else None."""
    if not isinstance(value, str):
        return None
    if kind == "plugin":
        return ("", value) if value.endswith(".py") else None
    if kind == "dataset":
        path = source_path(value)
        return None if path is None else (value[: len(value) - len(path)], path)
    if not is_saved_model(value):
        return None
    prefix, _, path = value.partition(":")
    return prefix + ":", path


# The deepest nesting of arrays and tables a config may have (the document itself is level 1).
# Committed configs nest at most 5 levels (a chain defense's steps with their parameters); the
# readers of a config (tomllib, copies, checks) recurse, and Python's recursion limit stops
# them near 500 levels with a traceback, so the depth is checked first.
MAX_DEPTH = 32
_TOO_DEEP = f"arrays or tables nested more than {MAX_DEPTH} levels deep (a config needs a few)"


def toml_document(text: str, source: str) -> dict[str, Any]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{source}: {_TOO_DEEP}") from None
    check_depth(doc, source)
    return doc


def check_depth(value: Any, source: str) -> None:
    """Refuses ``value`` if its arrays and tables nest deeper than `MAX_DEPTH` (walked without
    recursion, so that any depth gets the one-line refusal)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: {_TOO_DEEP}")
        if isinstance(item, Mapping):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)


def record_text(doc: Mapping[str, Any]) -> str:
    """A resolved config document as the TOML text of a ``config.toml`` record: the one place
    that writes config TOML (`RunSpec.to_toml`, and the Flower auditor's record of what it
    ran)."""
    return tomli_w.dumps(doc)


def with_settings(doc: Mapping[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """A copy of the config document ``doc`` with each ``KEY=VALUE`` of ``settings`` set, in
    order. KEY is a dotted path of tables (``images``, ``training.dp.noise_multiplier``); VALUE
    is a TOML value (``8``, ``1e-3``, ``true``, ``"text"``, ``[0, 1]``,
    ``[{name = "idlg"}]``), and a bare word that is not one (``cifar10``, ``folder:/data``) is
    the string it spells. A list of tables (``attack``, ``defense``) is set whole.

    Raises:
        ConfigError: One line naming the setting refused.
    """
    out = copy.deepcopy(dict(doc))
    for setting in settings:
        key, sep, text = setting.partition("=")
        path = key.strip().split(".")
        if not sep or not all(part.strip() for part in path):
            raise ConfigError(f"--set {setting!r}: expected KEY=VALUE, e.g. images=8")
        table = out
        for depth, part in enumerate(path[:-1]):
            table = table.setdefault(part.strip(), {})
            if not isinstance(table, dict):
                where = ".".join(path[: depth + 1])
                what = "a list of tables; set it whole" if isinstance(table, list) else "a value"
                raise ConfigError(f"--set {setting!r}: {where} is {what}, not a table")
        table[path[-1].strip()] = _setting_value(setting, text.strip())
    return out


def _setting_value(setting: str, text: str) -> Any:
    where = f"--set {setting.partition('=')[0].strip()}=..."
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except RecursionError:
        raise ConfigError(f"{where}: {_TOO_DEEP}") from None
    except tomllib.TOMLDecodeError:
        if re.fullmatch(r"[\w.:/+-]+", text):
            return text
        raise ConfigError(
            f"--set {setting!r}: the value is neither TOML nor a bare word "
            "(quote a string with spaces: KEY='\"a b\"')"
        ) from None
    check_depth(value, where)
    return value
