"""The grid of a run: a list given for an attack or defense parameter sweeps it, and each
combination of the listed values becomes its own attack or defense (a list of tables, such as
the chain defense's ``steps`` or an attack's ``priors``, is one value, not a sweep)."""

from __future__ import annotations

import itertools
from typing import Any


def is_sweep(value: Any) -> bool:
    """A list sweeps its parameter, except a list of tables (a chain's ``steps``, an attack's
    ``priors``), which is one value."""
    return isinstance(value, list) and not (value and all(isinstance(v, dict) for v in value))


def expand(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the swept values of ``params``, sweeps in the order of their names."""
    sweeps = {k: v for k, v in params.items() if is_sweep(v) and k != "steps"}
    fixed = {k: v for k, v in params.items() if k not in sweeps}
    keys = sorted(sweeps)
    return [
        {**fixed, **dict(zip(keys, combo, strict=True))}
        for combo in itertools.product(*(sweeps[k] for k in keys))
    ]
