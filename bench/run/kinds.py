"""The parameter kinds of the run description that `leakbench.core.params` does not have: a
top-level value in the config's own words, the run's seeds, and the checkpoints of a
leakage-over-training run."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

from leakbench.components.saved_models import is_saved_model, saved_model_path
from leakbench.core.errors import ConfigError
from leakbench.core.params import PLAIN, Kind, Style
from leakbench.core.seeds import MAX_SEED

# The most points of training one leakage-over-training run attacks the model at.
MAX_CHECKPOINTS = 16
# The most seeds of one run. Committed configs use one; each seed repeats the whole plan, so
# 1,000 is already a thousand runs' worth of trials, and a longer list is a slip (a range
# written out), not a study.
MAX_SEEDS = 1000


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer; bool is an int subclass, but true is not a number a
    user means to give."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (never a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Described(Kind):
    """A value of a top-level key, accepted when ``accepts`` says so and refused in the
    config's own words: ``{key} must be {words}, got {value!r}{hint}``.

    Attributes:
        words: What the key accepts, as it follows "must be" in the message.
        accepts: Whether a value is accepted.
        convert: The value to store for an accepted one.
        hint: Text the message ends with (advice after the value).
    """

    words: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any], Any] = lambda value: value
    hint: str = ""

    def describe(self, style: Style = PLAIN) -> str:
        return self.words

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not self.accepts(value):
            raise ConfigError(f"{label} must be {self.words}, got {value!r}{self.hint}")
        return self.convert(value)


@dataclasses.dataclass(frozen=True)
class Checkpoints(Kind):
    """Up to `MAX_CHECKPOINTS` increasing numbers >= 0 (training progress in
    ``checkpoint_unit``s), or saved models ``keras:PATH`` in training order; a tuple."""

    def describe(self, style: Style = PLAIN) -> str:
        return (
            f"a list of up to {MAX_CHECKPOINTS} increasing numbers >= 0 (epochs or steps), or "
            'of saved models "keras:PATH"'
        )

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) > MAX_CHECKPOINTS:
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        if all(isinstance(v, str) for v in value):
            for entry in value:
                if not is_saved_model(entry):
                    raise ConfigError(f"{label}: {entry!r} is not a saved model keras:PATH")
                saved_model_path(entry)  # a missing or wrong file is refused now
            return tuple(value)
        numbers = all(is_number(v) and math.isfinite(v) and v >= 0 for v in value)
        if not numbers or any(b <= a for a, b in itertools.pairwise(value)):
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        return tuple(value)


@dataclasses.dataclass(frozen=True)
class Seeds(Kind):
    """One seed or a list of 1 to `MAX_SEEDS` distinct seeds in [0, `MAX_SEED`], stored as a
    tuple."""

    def describe(self, style: Style = PLAIN) -> str:
        return (
            f"a list of 1 to {MAX_SEEDS} integers in [0, 2**31 - 1]; each seed draws the "
            "images, the weights and the noise"
        )

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        seeds = [value] if is_int(value) else value
        if isinstance(seeds, (list, tuple)) and len(seeds) > MAX_SEEDS:
            raise ConfigError(f"{label} must be {self.describe(style)}, got {len(seeds)} seeds")
        if (
            not isinstance(seeds, (list, tuple))
            or not seeds
            or not all(is_int(s) and 0 <= s <= MAX_SEED for s in seeds)
            or len(set(seeds)) != len(seeds)
        ):
            raise ConfigError(
                f"{label} must be {self.describe(style)} without repeats, got {seeds!r}"
            )
        return tuple(seeds)


@dataclasses.dataclass(frozen=True)
class Integers(Kind):
    """A list of ``1`` to ``most`` distinct integers in [``low``, ``high``], stored as a sorted
    tuple (a bare integer is a list of one)."""

    low: int
    high: int
    most: int = 8

    def describe(self, style: Style = PLAIN) -> str:
        return f"a list of 1 to {self.most} distinct integers in [{self.low}, {self.high}]"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        values = [value] if is_int(value) else value
        if (
            not isinstance(values, (list, tuple))
            or not 1 <= len(values) <= self.most
            or not all(is_int(v) and self.low <= v <= self.high for v in values)
            or len(set(values)) != len(values)
        ):
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        return tuple(sorted(values))
