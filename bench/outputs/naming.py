"""Short human-readable names of attack and defense configurations, for tables and figures."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from leakbench.core.params import aliases_of, rename_aliases


def attack_label(name: str, params_json: str) -> str:
    """The attack's name with the parameters that differ from its defaults, e.g.
    ``dlg loss=cosine match=kept``: short enough for a printed table, unique within a run."""
    from leakbench.attacks import ATTACKS

    return _changed(name, params_json, ATTACKS.peek(name))


def _changed(name: str, params_json: str, cls: type | None) -> str:
    """``name`` with the parameters that differ from the defaults of ``cls`` (none where
    this installation does not know it: the bare name)."""
    params = json.loads(params_json)
    if cls is None:
        return name
    # Runs stored before a parameter was renamed (e.g. restarts) keep their short labels.
    params = rename_aliases(params, aliases_of(cls))
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    changed = [f"{k}={_value(v)}" for k, v in sorted(params.items()) if defaults.get(k) != v]
    return " ".join([name, *changed])


def defense_label(name: str, params_json: str, short: bool = False) -> str:
    """The defense with all its parameters, e.g. ``gaussian sigma=0.01``; a chain's steps are
    joined with ``+`` (``clip norm=1 + gaussian sigma=0.01``). ``short``: only the parameters
    that differ from the defense's defaults, as `attack_label` (a text run's tables)."""
    if short:
        from leakbench.defenses import DEFENSES

        return _changed(name, params_json, DEFENSES.peek(name))
    params = json.loads(params_json)
    if name == "chain" and isinstance(params.get("steps"), list):
        return " + ".join(_step_label(step) for step in params["steps"])
    return " ".join([name, *(f"{k}={_value(v)}" for k, v in sorted(params.items()))])


def _step_label(step: dict[str, Any]) -> str:
    rest = {k: v for k, v in step.items() if k != "name"}
    return defense_label(str(step.get("name")), json.dumps(rest))


def _value(value: Any) -> str:
    """Numbers in their shortest exact form (0.001, 1e-05, 1), other values as JSON."""
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)
