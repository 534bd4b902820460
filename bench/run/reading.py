"""The tables of a config document read into the run description's parts: ``[[attack]]`` and
``[[defense]]`` into `ComponentSpec`s (defaults filled in, old names renamed), ``[training]``,
``[threat_model]`` and ``[epsilon_audit]`` into their dataclasses. Each refuses a table of the
wrong shape or an unknown key in one line naming the keys allowed; the dataclasses check the
values."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from leakbench.client.recipes import DPRecipe, TrainingConfig
from leakbench.core.errors import ConfigError
from leakbench.core.params import SECTION, aliases_of, keyed_when_set, resolve_aliases
from leakbench.core.registry import Registry
from leakbench.run.grid import MAX_CONFIGURATIONS, count
from leakbench.run.sections import ComponentSpec, EpsilonAuditSpec, TextSettings, ThreatModel

# The top-level keys that are tables, as their messages describe them.
TABLES = {
    "attack": "an array of tables [[attack]] with a name and parameters",
    "defense": "an array of tables [[defense]] with a name and parameters",
    "training": "a table [training] with enabled, epochs, batch_size, optimizer, learning_rates, "
    "validation, seeds, delta and a table [training.dp]",
    "threat_model": "a table [threat_model] with labels_known, train_steps, private_split, "
    "clients, local_steps, local_epochs, local_batch_size, local_lr, shares, "
    "bn_statistics_known, server, detect, checkpoints, checkpoint_unit",
    "epsilon_audit": "a table [epsilon_audit] with rounds, confidence, delta, canary_norm, "
    "canaries, batches",
    "text": "a table [text] with sequence_length, max_words, public_share, batch_sizes, "
    "tie_embeddings, freeze_embeddings, test_sentences, train_epochs, train_batch_size, "
    "learning_rate",
}


def read_training(table: Any, stacklevel: int = 1) -> TrainingConfig | None:
    """``[training]``: a `TrainingConfig`, or None for ``enabled = false``. An old key's notice
    points ``stacklevel`` frames up (1: the caller)."""
    if not isinstance(table, dict):
        raise ConfigError(f"training must be {TABLES['training']}")
    names = {f.name for f in dataclasses.fields(TrainingConfig)}
    fields = names | {"enabled"} | {a.old for a in aliases_of(TrainingConfig)}
    for key in table:
        if key not in fields:
            raise ConfigError(f"unknown key training.{key}; allowed: {', '.join(sorted(fields))}")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"training.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return None
    given = {k: v for k, v in table.items() if k != "enabled"}
    # An old name becomes its new one here (one notice).
    given = resolve_aliases(
        given, aliases_of(TrainingConfig), "training", SECTION, stacklevel=stacklevel + 1
    )
    if "dp" in given:
        given["dp"] = _dp_recipe(given["dp"])
    return TrainingConfig(**given)


def _dp_recipe(table: Any) -> DPRecipe:
    """``[training.dp]``: a `DPRecipe`."""
    if not isinstance(table, dict):
        raise ConfigError(
            "training.dp must be a table [training.dp] with enabled, epochs, batch_size, "
            f"optimizer, learning_rates, got {table!r}"
        )
    fields = {f.name for f in dataclasses.fields(DPRecipe)}
    for key in table:
        if key not in fields:
            raise ConfigError(
                f"unknown key training.dp.{key}; allowed: {', '.join(sorted(fields))}"
            )
    return DPRecipe(**table)


# A config section's dataclass (`read_section`).
_Section = TypeVar("_Section", ThreatModel, EpsilonAuditSpec, TextSettings)


def read_text(table: Any, dataset: str, text_run: bool) -> TextSettings | None:
    """``[text]``: a text run's `TextSettings` (the defaults where the table is absent), None
    for an image run, which refuses the table."""
    if not text_run:
        if table is not None:
            raise ConfigError(
                f"text: the [text] table is for a text corpus; dataset {dataset} is an image "
                "dataset (text corpora: tinyshakespeare, text:PATH)"
            )
        return None
    return read_section({} if table is None else table, "text", TextSettings)


def read_epsilon_audit(table: Any) -> EpsilonAuditSpec | None:
    """``[epsilon_audit]``, or None where the config has no such table (no audit)."""
    return None if table is None else read_section(table, "epsilon_audit", EpsilonAuditSpec)


def read_threat_model(table: Any) -> ThreatModel:
    """``[threat_model]``."""
    return read_section(table, "threat_model", ThreatModel)


def read_section(table: Any, name: str, cls: type[_Section]) -> _Section:
    """The table ``[name]`` as a ``cls``, refusing a non-table or an unknown key in one line
    naming the keys allowed (``cls`` checks the values)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{name} must be {TABLES[name]}")
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in table:
        if key not in fields:
            raise ConfigError(f"unknown key {name}.{key}; allowed: {', '.join(sorted(fields))}")
    return cls(**table)


def read_components(
    tables: Any, key: str, registry: Registry[Any], stacklevel: int = 1
) -> tuple[ComponentSpec, ...]:
    """The ``[[key]]`` tables (``key`` is ``"attack"`` or ``"defense"``) as `ComponentSpec`s:
    old parameter names renamed (one notice per table, pointing ``stacklevel`` frames up) and
    the defaults filled in, keys sorted; None (no such table) is refused. ``registry`` is the
    run's modality's (`leakbench.attacks.attacks_of`): an attack of another modality is
    refused in its one line."""
    allowed = registry.names()
    if tables is None:
        raise ConfigError(f"at least one [[{key}]] table is required; names: {', '.join(allowed)}")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{key} must be {TABLES[key]}")
    specs = []
    for i, table in enumerate(tables):
        name = table.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"{key}[{i}].name must be a string; allowed: {', '.join(allowed)}")
        cls = registry.get(name)
        params = {k: v for k, v in table.items() if k != "name"}
        for given, value in params.items():
            if isinstance(value, list) and given != "steps" and not value:
                raise ConfigError(f"{key}[{i}] ({name}): {given} sweep list is empty")
        # Old parameter names become new ones here, so that the resolved config and the trial
        # keys only ever hold the new names.
        aliases = aliases_of(cls)
        params = resolve_aliases(
            params, aliases, f"{key} {name}", sweeps=True, stacklevel=stacklevel + 1
        )
        # Parameters that are part of keys only when set stay out of the resolved config too.
        optional = keyed_when_set(cls)
        defaults = {
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING and f.name not in {*params, *optional}
        }
        # Sorted, so that configs that differ only in the order of keys resolve to one text.
        specs.append(ComponentSpec(name, dict(sorted({**defaults, **params}.items()))))
    _check_count(key, specs)
    return tuple(specs)


def _check_count(key: str, specs: list[ComponentSpec]) -> None:
    """Refuses ``[[key]]`` tables whose sweeps make more than `MAX_CONFIGURATIONS`
    configurations together, counted without expanding them."""
    total = sum(count(spec.params) for spec in specs)
    if total > MAX_CONFIGURATIONS:
        raise ConfigError(
            f"{key}: the [[{key}]] tables make {total} configurations with their sweeps "
            f"expanded; at most {MAX_CONFIGURATIONS}"
        )
