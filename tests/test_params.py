"""The declared parameters of `leakbench.core.params`: kinds, messages, validate and aliases."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import warnings
from typing import Any

import pytest

from leakbench.core.errors import ConfigError
from leakbench.core.params import (
    PLAIN,
    REQUIRED,
    SECTION,
    Alias,
    Choice,
    Flag,
    Int,
    Number,
    Scalar,
    Style,
    Text,
    aliases_of,
    check,
    declared,
    param,
    rename_aliases,
    resolve_aliases,
    validate,
)

DEFENSE_LIKE = Style(number_format="g", range_message=True)


def _message(kind: Any, value: Any, style: Style = PLAIN, where: str = "attack x") -> str:
    with pytest.raises(ConfigError) as info:
        check(value, kind, where, "p", style)
    return str(info.value)


# --- Int ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 5, 10])
def test_int_accepts_both_closed_bounds(value: int) -> None:
    assert check(value, Int(1, 10), "attack x", "p") == value


@pytest.mark.parametrize("value", [0, 11, -1, 1.0, 1.5, "3", None, True, False, math.nan])
def test_int_refuses_values_outside_or_of_another_type(value: Any) -> None:
    assert (
        _message(Int(1, 10), value) == f"attack x: p must be an integer in [1, 10], got {value!r}"
    )


def test_int_refuses_bools_even_inside_the_range() -> None:
    # True == 1 and False == 0, but a flag is not a count.
    assert _message(Int(0, 1), True) == "attack x: p must be an integer in [0, 1], got True"
    assert _message(Int(), False) == "attack x: p must be an integer, got False"


def test_int_descriptions_of_half_open_and_unbounded_ranges() -> None:
    assert Int(0).describe() == "an integer >= 0"
    assert Int(high=3).describe() == "an integer <= 3"
    assert Int().describe() == "an integer"
    # Large bounds are printed as plain integers, whatever the style.
    assert Int(0, 1_000_000).describe(DEFENSE_LIKE) == "an integer in [0, 1000000]"
    assert check(10**30, Int(0), "w", "p") == 10**30
    assert _message(Int(0), -1) == "attack x: p must be an integer >= 0, got -1"


# --- Number ---------------------------------------------------------------------------------


def test_number_closed_interval_includes_its_bounds_and_stores_a_float() -> None:
    kind = Number(0.0, 1.0)
    for value in (0, 0.0, 0.5, 1, 1.0):
        out = check(value, kind, "w", "p")
        assert out == value and type(out) is float


def test_number_open_bounds_exclude_exactly_the_bound() -> None:
    kind = Number(0.0, 1.0, low_open=True, high_open=True)
    assert check(1e-300, kind, "w", "p") == 1e-300
    assert check(math.nextafter(1.0, 0.0), kind, "w", "p") < 1.0
    assert _message(kind, 0.0) == "attack x: p must be a number in (0.0, 1.0), got 0.0"
    assert _message(kind, 1) == "attack x: p must be a number in (0.0, 1.0), got 1"


def test_number_half_open_intervals() -> None:
    low_open = Number(0.0, 1.0, low_open=True)
    assert check(1.0, low_open, "w", "p") == 1.0
    assert _message(low_open, 0.0, DEFENSE_LIKE, "defense d") == (
        "defense d: p must be in (0, 1], got 0.0"
    )
    high_open = Number(0.0, 1.0, high_open=True)
    assert check(0.0, high_open, "w", "p") == 0.0
    assert "[0.0, 1.0)" in _message(high_open, 1.0)


def test_number_without_a_bound_is_open_towards_infinity() -> None:
    kind = Number(0.0)
    assert kind.interval() == "[0.0, inf)"
    assert kind.interval(DEFENSE_LIKE) == "[0, inf)"
    assert check(1e308, kind, "w", "p") == 1e308
    assert Number(high=2).interval(DEFENSE_LIKE) == "(-inf, 2]"


@pytest.mark.parametrize("value", [True, False, "1", None, [1], math.nan, math.inf, -math.inf])
def test_number_refuses_bools_strings_and_non_finite_values_as_wrong_types(value: Any) -> None:
    # Defense style: a wrong type says "a number in", an out-of-range number says only "in".
    assert _message(Number(0.0), value, DEFENSE_LIKE, "defense gaussian") == (
        f"defense gaussian: p must be a number in [0, inf), got {value!r}"
    )


def test_number_out_of_range_messages_in_both_wordings() -> None:
    kind = Number(1e-8, 10.0)
    # Attacks print bounds with str() and use one wording.
    assert _message(kind, 0) == "attack x: p must be a number in [1e-08, 10.0], got 0"
    assert _message(kind, 11.5) == "attack x: p must be a number in [1e-08, 10.0], got 11.5"
    # Defenses print bounds with :g and a shorter wording for numbers out of range.
    assert _message(kind, 0, DEFENSE_LIKE, "defense d") == (
        "defense d: p must be in [1e-08, 10], got 0"
    )
    assert _message(Number(0.0), -1, DEFENSE_LIKE, "defense gaussian") == (
        "defense gaussian: p must be in [0, inf), got -1"
    )


def test_number_options_keep_the_value_and_allow_non_finite() -> None:
    kept = Number(0.0, 10.0, low_open=True, high_open=True, as_float=False)
    out = check(1, kept, "w", "p")
    assert out == 1 and type(out) is int
    anything = Number(finite=False, as_float=False)
    assert anything.describe() == "a number"
    assert math.isnan(check(math.nan, anything, "w", "p"))
    assert check(-math.inf, anything, "w", "p") == -math.inf
    assert _message(anything, "x", DEFENSE_LIKE, "defense f") == (
        "defense f: p must be a number, got 'x'"
    )


# --- Choice, Flag, Text, Scalar -------------------------------------------------------------


def test_choice_messages_in_both_listings() -> None:
    assert check("b", Choice("a", "b"), "w", "p") == "b"
    assert _message(Choice("a", "b"), "c") == "attack x: p must be 'a' or 'b', got 'c'"
    assert _message(Choice("a", "b", "c"), 1) == "attack x: p must be 'a' or 'b' or 'c', got 1"
    assert _message(Choice("sgd", "adam", one_of=True), "rmsprop", SECTION, "training") == (
        "training.p must be one of sgd, adam, got 'rmsprop'"
    )
    with pytest.raises(ValueError):
        Choice()


def test_flag_accepts_only_bools() -> None:
    assert check(False, Flag(), "w", "p") is False
    for value in (0, 1, "true", None):
        assert _message(Flag(), value, SECTION, "threat_model") == (
            f"threat_model.p must be true or false, got {value!r}"
        )


def test_text_and_scalar() -> None:
    assert check("", Text(), "w", "p") == ""
    assert _message(Text(), 1, DEFENSE_LIKE, "defense f") == "defense f: p must be a string, got 1"
    for value in (None, True, 1, 1.5, "s"):
        assert check(value, Scalar(), "w", "p") is value
    assert _message(Scalar(), [1], DEFENSE_LIKE, "defense f") == (
        "defense f: p must be a number, a string, true or false, got [1]"
    )


# --- validate on dataclasses ----------------------------------------------------------------


# Keyword-only, so that a required parameter may follow ones with defaults.
@dataclasses.dataclass(frozen=True, kw_only=True)
class _Owner:
    count: int = param(3, Int(1, 5), doc="how many")
    scale: float = param(1.0, Number(0.0))
    mode: str = param("a", Choice("a", "b"))
    plain: Any = None  # not declared: never checked
    needed: float = param(REQUIRED, Number(0.0), doc="must be given")

    def __post_init__(self) -> None:
        validate(self, "owner o")


def test_validate_checks_declared_fields_in_order_and_normalises_numbers() -> None:
    owner = _Owner(scale=2, plain=object(), needed=0)
    assert type(owner.scale) is float and type(owner.needed) is float
    with pytest.raises(
        ConfigError, match=r"^owner o: count must be an integer in \[1, 5\], got 0$"
    ):
        _Owner(count=0, scale=-1.0, needed=1.0)
    with pytest.raises(ConfigError, match="^owner o: scale must be"):
        _Owner(scale=-1.0, needed=1.0)
    with pytest.raises(TypeError):
        _Owner()  # type: ignore[call-arg]  # a REQUIRED parameter has no default


def test_declared_lists_kinds_and_docs() -> None:
    found = {field.name: decl for field, decl in declared(_Owner)}
    assert list(found) == ["count", "scale", "mode", "needed"]
    assert found["count"].kind == Int(1, 5) and found["count"].doc == "how many"
    assert dataclasses.fields(_Owner)[0].default == 3


def test_section_style_joins_with_a_dot() -> None:
    @dataclasses.dataclass
    class Section:
        steps: int = param(0, Int(0, 10))

        def __post_init__(self) -> None:
            validate(self, "section", SECTION)

    with pytest.raises(ConfigError) as info:
        Section(steps=11)
    assert str(info.value) == "section.steps must be an integer in [0, 10], got 11"


# --- aliases --------------------------------------------------------------------------------

SAME = Alias("old", "new", Int(0, 9))
PLUS_ONE = Alias(
    "extra", "total", Int(0, 9), convert=lambda k: k + 1, hint="extra = k is total = k + 1"
)


def test_an_alias_is_renamed_with_exactly_one_notice() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = resolve_aliases({"old": 3, "x": 1}, [SAME], "attack a")
    assert out == {"new": 3, "x": 1}
    assert [str(w.message) for w in caught] == [
        "attack a: 'old' is deprecated; use 'new' (same meaning)"
    ]
    assert caught[0].category is FutureWarning
    # The notice points at the caller (stacklevel=1): this file.
    assert caught[0].filename == __file__


def test_an_alias_converts_values_and_sweeps() -> None:
    with pytest.warns(FutureWarning, match=r"use 'total' \(extra = k is total = k \+ 1\)"):
        assert resolve_aliases({"extra": 2}, [PLUS_ONE], "w") == {"total": 3}
    with pytest.warns(FutureWarning):
        assert resolve_aliases({"extra": [0, 2]}, [PLUS_ONE], "w", sweeps=True) == {"total": [1, 3]}


def test_no_alias_no_notice() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_aliases({"new": 1}, [SAME], "w") == {"new": 1}


def test_a_bad_alias_value_names_the_old_parameter_without_a_notice() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a notice would raise here
        with pytest.raises(ConfigError) as info:
            resolve_aliases({"extra": 1.5}, [PLUS_ONE], "attack ig")
        assert str(info.value) == "attack ig: extra must be an integer in [0, 9], got 1.5"
        with pytest.raises(ConfigError, match="extra must be"):
            resolve_aliases({"extra": [1, -1]}, [PLUS_ONE], "attack ig", sweeps=True)


def test_both_the_alias_and_the_new_name_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_aliases({"old": 1, "new": 1}, [SAME], "attack a")
    message = str(info.value)
    assert message.startswith("attack a: old ") and "new" in message and "\n" not in message


def test_rename_aliases_is_quiet_and_keeps_new_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rename_aliases({"extra": 0, "y": 1}, [PLUS_ONE]) == {"total": 1, "y": 1}
        assert rename_aliases({"old": 1, "new": 2}, [SAME]) == {"old": 1, "new": 2}


def test_aliases_of_drops_an_old_name_that_a_subclass_declares_as_its_own() -> None:
    @dataclasses.dataclass(frozen=True)
    class Base:
        aliases = (SAME, PLUS_ONE)
        new: int = 0

    @dataclasses.dataclass(frozen=True)
    class Own(Base):
        old: int = 0  # this class's own parameter, not the alias of `new`

    assert aliases_of(Base) == (SAME, PLUS_ONE)
    assert aliases_of(Own) == (PLUS_ONE,)


# --- the foundation's own imports -----------------------------------------------------------


def test_params_imports_only_errors_and_the_standard_library() -> None:
    code = (
        "import sys; import leakbench.core.params; "
        "print(sorted(m for m in sys.modules if m.startswith('leakbench')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == (
        "['leakbench', 'leakbench.core', 'leakbench.core.errors', 'leakbench.core.params']"
    )
    assert (
        "numpy"
        not in subprocess.run(
            [sys.executable, "-c", "import sys, leakbench.core.params; print(sorted(sys.modules))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
