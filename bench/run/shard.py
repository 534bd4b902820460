"""Shards for job arrays: which share of a run's work ``leakbench run --shard i/n`` does.

A shard owns whole attack groups (`leakbench.run.plan.attack_groups`), never single trials:
batched attacks can differ in the last bits between group compositions, so only whole groups
computed as in an unsharded run make the union of the shards equal that run. Shard ``i`` of
``n`` (1-based, like ``--array=1-n`` job indices) takes the ``i``-th of ``n`` contiguous,
near-equal slices of the groups in plan order, and likewise of the utility trainings.
Contiguous slices keep a shard's groups few seeds wide (fewer models to build, observed
gradients shared between the attacks of a cell) and mix the attack and defense configurations
of the plan, so shards take about equal time.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from leakbench.core.errors import ConfigError
from leakbench.core.files import write_text

T = TypeVar("T")

# The record in a shard's run directory; `merge` reads it. Unsharded runs have none.
SHARD_FILE = "shard.json"

_SYNTAX = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")
_ALLOWED = "I/N with integers 1 <= I <= N (1-based: 1/4, 2/4, 3/4, 4/4)"


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based). ``Shard(1, 1)`` is the whole run."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ConfigError(f"--shard must be {_ALLOWED}, got '{self.index}/{self.count}'")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Reads ``"I/N"``; anything else raises `ConfigError` naming ``--shard``."""
        match = _SYNTAX.fullmatch(text)
        if match is None:
            raise ConfigError(f"--shard must be {_ALLOWED}, got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def whole(self) -> bool:
        return self.count == 1

    def take(self, items: Sequence[T]) -> list[T]:
        """This shard's contiguous slice of ``items``; the ``count`` slices partition them and
        differ in length by at most one."""
        total = len(items)
        start = total * (self.index - 1) // self.count
        stop = total * self.index // self.count
        return list(items[start:stop])

    def owners(self, total: int) -> list[int]:
        """The shard index (of ``count``) whose `take` holds each of ``total`` items."""
        n = self.count
        owner = []
        for position in range(total):
            # The estimate is at most one slice short (the slice ends are rounded down).
            index = position * n // total + 1
            while total * index // n <= position:
                index += 1
            owner.append(index)
        return owner


# The whole run: what an unsharded run does and what a directory without a record holds.
WHOLE = Shard(1, 1)


def write_record(out: Path, shard: Shard) -> None:
    """Records in ``out`` which shard it holds (nothing for a whole run)."""
    if not shard.whole:
        record = {"count": shard.count, "index": shard.index}
        write_text(out / SHARD_FILE, json.dumps(record) + "\n")


def read_record(out: Path) -> Shard:
    """The shard a run directory holds; ``1/1`` when it has no record (an unsharded run)."""
    path = out / SHARD_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return WHOLE
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} cannot be read as a shard record ({err})") from None
    index, count = (
        _integer(doc.get(k)) if isinstance(doc, dict) else None for k in ("index", "count")
    )
    if index is None or count is None:
        raise ConfigError(f"{path} is not a shard record (expected index and count integers)")
    try:
        return Shard(index, count)
    except ConfigError:
        raise ConfigError(f"{path} records an impossible shard {index}/{count}") from None


def _integer(value: object) -> int | None:
    """``value`` if it is an int (a bool is not), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
