"""Canonical text and stable hashes of plain values (configs, parameters, trial identities).

A foundation module: the config, the store, the run directory and the arrays all use it, and it
imports nothing of leakbench, so none of them depends on another for it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the canonical text of parameters."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def stable_hash(value: Any, length: int) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]
