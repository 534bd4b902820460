"""The checks of a config that need no TensorFlow, made before it is imported, so that a
malformed config is refused in a fraction of a second (`precheck`).

It reads the document as `leakbench.run.config.load_config` does (`leakbench.run.document`:
the file, its TOML, ``--set``, its paths), then checks against the shipped catalogue
(`leakbench.core.catalogue`) the names and the values whose kinds the catalogue holds: the
top-level keys, the dataset, the model, the sections' keys and values, and every attack's and
defense's name, parameters and values (each value of a sweep), and protocol 2's fair budget
(`fair_budget`) where the defenses' names say it applies. A refusal is the line that the
full check gives for the same mistake (tests/test_precheck.py compares them); a config with
several mistakes may be refused for another of them first. What it cannot check here
(values of other kinds, checks that join several fields, a plugin's names) the full check
does once TensorFlow is loaded, so a config that passes is not yet known to be good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from leakbench.components.saved_models import is_saved_model, saved_model_path
from leakbench.core import catalogue
from leakbench.core.errors import ConfigError, UnknownNameError
from leakbench.core.params import Style
from leakbench.run.document import read_document
from leakbench.run.grid import is_sweep


def precheck(
    path: str | Path | None, settings: Sequence[str] = (), plugins: Sequence[str] = ()
) -> None:
    """Refuses the config at ``path`` (None: the built-in one) with ``settings`` and
    ``plugins`` (the CLI's ``--set`` and ``--plugin``) in one line if a check that needs no
    TensorFlow fails.

    Raises:
        ConfigError: The first mistake found (`UnknownNameError` for a name).
    """
    doc = read_document(path, settings, plugins)
    if doc.get("plugins") or catalogue.plugins_installed():
        return  # a plugin may add names and parameters: only the full check knows them
    check_document(doc, catalogue.load())


def check_document(doc: Mapping[str, Any], cat: Mapping[str, Any]) -> None:
    """`precheck` of a config document (what its TOML parses to) against ``cat``."""
    config = cat["config"]
    names = _names(cat)
    top = [v["name"] for v in config["values"]] + config["tables"]
    for key in doc:
        if key not in top:
            raise ConfigError(f"unknown key {key!r}; allowed: {', '.join(sorted(top))}")
    style = catalogue.style_of(config["style"])
    for value in config["values"]:
        if value["name"] in doc:
            kind = catalogue.kind_from_json(value["kind"], names)
            kind.check(doc[value["name"]], style.label("", value["name"]), style)
    model = doc.get("model", "lenet")
    if isinstance(model, str):
        _check_model(model, cat)
    dataset = doc.get("dataset", "digits")
    modality = _dataset_modality(dataset, cat) if isinstance(dataset, str) else None
    for section, entry in config["sections"].items():
        table = doc.get(section)
        if isinstance(table, dict):
            _check_section(section, table, entry, names)
    for key, plural in (("attack", "attacks"), ("defense", "defenses")):
        tables = doc.get(key)
        if isinstance(tables, list) and all(isinstance(t, dict) for t in tables):
            entries = [
                e for e in cat[plural] if key == "defense" or modality in (None, e["modality"])
            ]
            for i, table in enumerate(tables):
                _check_component(key, i, table, entries, names)
    if modality == "image":
        _check_budget(doc, cat)


def fair_budget(protocol: int, epochs: int, rates: int, dp_epochs: int, dp_rates: int) -> None:
    """Under protocol 2 or later, refuses a DP recipe (``dp_epochs`` passes, ``dp_rates``
    learning rates) that trains longer or searches more rates than ``[training]`` (``epochs``,
    ``rates``) does for every other defense; ``dp_epochs`` 0 takes ``epochs``
    (`leakbench.run.checks.check_fair_budget`, which calls it for a run with a defense that
    trains by the DP recipe).

    Raises:
        ConfigError: One line naming the key and what it must be.
    """
    if protocol < 2:
        return
    where = f"under protocol {protocol} every defense trains alike"
    if dp_epochs not in (0, epochs):
        raise ConfigError(
            f"training.dp.epochs must be 0 or training.epochs ({epochs}) {where}, got {dp_epochs}"
        )
    if dp_rates != rates:
        raise ConfigError(
            f"training.dp.learning_rates must list as many rates as training.learning_rates "
            f"({rates}) {where}, got {dp_rates}"
        )


def _check_budget(doc: Mapping[str, Any], cat: Mapping[str, Any]) -> None:
    """`fair_budget` for an image run with a defense the catalogue holds as example-level (a
    chain that starts with one is left to the full check), where every value it reads is
    plainly given or defaulted."""
    section = cat["config"]["sections"]["training"]
    training, defaults = doc.get("training", {}), section["defaults"]
    dp = training.get("dp", {}) if isinstance(training, dict) else None
    tables = doc.get("defense")
    if not isinstance(dp, dict) or not isinstance(tables, list):
        return
    # An old name for a field, or a recipe switched off: left to the full check.
    switched_off = any(t.get("enabled", True) is False for t in (training, dp))
    if set(section["aliases"]) & set(training) or switched_off:
        return
    example = {e["name"] for e in cat["defenses"] if e["level"] == "example"}
    if not any(isinstance(t, dict) and t.get("name") in example for t in tables):
        return
    protocol = doc.get("protocol", cat["suite"]["protocol"])
    epochs = training.get("epochs", defaults["epochs"])
    dp_epochs = dp.get("epochs", defaults["dp"]["epochs"])
    rates = training.get("learning_rates", defaults["learning_rates"])
    dp_rates = dp.get("learning_rates", defaults["dp"]["learning_rates"])
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (protocol, epochs, dp_epochs)):
        if isinstance(rates, list) and isinstance(dp_rates, list):
            fair_budget(protocol, epochs, len(rates), dp_epochs, len(dp_rates))


def _names(cat: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each registry's names, by the kind a `Registered` parameter names."""
    return dict(cat["names"])


def _check_model(model: str, cat: Mapping[str, Any]) -> None:
    if is_saved_model(model):
        saved_model_path(model)
        return
    names = sorted(e["name"] for e in cat["models"])
    if model not in names:
        raise UnknownNameError(f"unknown model {model!r}; allowed: {', '.join(names)}")


def _dataset_modality(dataset: str, cat: Mapping[str, Any]) -> str:
    """The dataset's modality; an unknown name or prefix is refused as the registries do."""
    prefix, sep, _ = dataset.partition(":")
    entries = cat["file_sources"] if sep else cat["datasets"]
    name, kind = (prefix, "file source") if sep else (dataset, "dataset")
    for entry in entries:
        if entry["name"] == name:
            return str(entry["modality"])
    allowed = ", ".join(sorted(e["name"] for e in entries))
    raise UnknownNameError(f"unknown {kind} {name!r}; allowed: {allowed}")


def _check_section(
    section: str, table: Mapping[str, Any], entry: Mapping[str, Any], names: Any
) -> None:
    fields = {p["name"] for p in entry["params"]} | set(entry["extra_keys"])
    allowed = fields | set(entry["aliases"])
    for key in table:
        if key not in allowed:
            raise ConfigError(f"unknown key {section}.{key}; allowed: {', '.join(sorted(allowed))}")
    if section == "training" and table.get("enabled", True) is False:
        return  # a disabled training's other keys are not read
    if not set(entry["aliases"]) & set(table):
        _check_values(table, entry, names, sweeps=False)


def _check_component(
    key: str, i: int, table: Mapping[str, Any], entries: list[Mapping[str, Any]], names: Any
) -> None:
    """An ``[[attack]]`` or ``[[defense]]`` table: its name, parameters and values."""
    name = table.get("name")
    allowed = sorted(e["name"] for e in entries)
    if not isinstance(name, str):
        raise ConfigError(f"{key}[{i}].name must be a string; allowed: {', '.join(allowed)}")
    entry = next((e for e in entries if e["name"] == name), None)
    if entry is None:
        if key == "attack" and name in names["attack"]:
            return  # another modality's attack: the full check names the right ones
        raise UnknownNameError(f"unknown {key} {name!r}; allowed: {', '.join(allowed)}")
    params = {k: v for k, v in table.items() if k != "name"}
    for given, value in params.items():
        if isinstance(value, list) and given != "steps" and not value:
            raise ConfigError(f"{key}[{i}] ({name}): {given} sweep list is empty")
    if set(entry["aliases"]) & set(params):
        return  # an old name: renamed (with its notice) by the full check
    where = entry["where"]
    fields = sorted(p["name"] for p in entry["params"] if p["init"])
    unknown = sorted(set(params) - set(fields))
    if unknown:
        allowed_params = ", ".join(fields) or "none"
        raise ConfigError(f"{where}: unknown parameter {unknown[0]!r}; allowed: {allowed_params}")
    missing = sorted(
        p["name"] for p in entry["params"] if p["required"] and p["name"] not in params
    )
    if missing:
        raise ConfigError(f"{where}: parameter {missing[0]!r} is required")
    _check_values(params, entry, names, sweeps=True)


def _check_values(
    params: Mapping[str, Any], entry: Mapping[str, Any], names: Any, *, sweeps: bool
) -> None:
    """Each given value of a declared parameter, in declaration order; with ``sweeps``, each
    value of a list (a list of tables is one value)."""
    style: Style = catalogue.style_of(entry["style"])
    for param in entry["params"]:
        if param["name"] not in params:
            continue
        kind = catalogue.kind_from_json(param["kind"], names)
        label = style.label(entry["where"], param["name"])
        value = params[param["name"]]
        swept = sweeps and is_sweep(value) and param["name"] != "steps"
        for one in value if swept else [value]:
            kind.check(one, label, style)
