"""The grid of a run: a list given for an attack or defense parameter sweeps it, and each
combination of the listed values becomes its own attack or defense (a list of tables, such as
the chain defense's ``steps`` or an attack's ``priors``, is one value, not a sweep)."""

from __future__ import annotations

import itertools
import math
from typing import Any

# The most attack (or defense) configurations one config may make, its tables' sweeps
# expanded. Committed configs make at most 27; each configuration meets every image of every
# seed, so 1,000 is already a very large study, and the count is checked before a sweep is
# expanded (a few long lists multiply into billions).
MAX_CONFIGURATIONS = 1000


def is_sweep(value: Any) -> bool:
    """A list sweeps its parameter, except a list of tables (a chain's ``steps``, an attack's
    ``priors``), which is one value."""
    return isinstance(value, list) and not (value and all(isinstance(v, dict) for v in value))


def _sweeps(params: dict[str, Any]) -> dict[str, Any]:
    """The swept parameters of ``params`` (a chain's ``steps`` is never a sweep)."""
    return {k: v for k, v in params.items() if is_sweep(v) and k != "steps"}


def count(params: dict[str, Any]) -> int:
    """How many configurations `expand` makes of ``params``, without making them."""
    return math.prod(len(values) for values in _sweeps(params).values())


def expand(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the swept values of ``params``, sweeps in the order of their names."""
    sweeps = _sweeps(params)
    fixed = {k: v for k, v in params.items() if k not in sweeps}
    keys = sorted(sweeps)
    return [
        {**fixed, **dict(zip(keys, combo, strict=True))}
        for combo in itertools.product(*(sweeps[k] for k in keys))
    ]
