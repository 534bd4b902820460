"""What the fillers of the generated passages share (`benchmarks/readme_numbers.py` writes the
passages into the pages).

A passage's text is a Markdown template, `results/<folder>/passages/NAME.md`, with named fields
(`{name}`), and the function that fills it lives beside the results it reads, in
`results/<folder>/numbers.py`: registered with `span` or `block`, it reads the CSVs through
`Results` and returns the value of each field, already printed as the page prints it (the
number formats below). Where a word of the passage depends on the results (a verdict, "every",
an order, a comparison) the function derives it from the data or checks it with `claim`, so that
a changed result cannot leave a false sentence behind. A template's literal text quotes no
committed CSV: its numbers are the papers', older runs' or the configs'. CSVs are read by column
name, so columns added later do not matter.

A *span* is a phrase inside a paragraph written by hand: its template is exactly its text, line
breaks included. A *block* is whole paragraphs, a list, a table or a fenced block: its prose is
refilled to WIDTH columns after filling (`refill=False` keeps a table or a fence as filled), so
that lists whose length depends on the results wrap cleanly.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import string
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# The column that block prose is filled to (the README's hand-wrapped paragraphs end near it).
WIDTH = 94


class ReadmeError(Exception):
    """README.md and this script do not fit together."""


class StaleClaim(ReadmeError):
    """A word of a passage that depends on the results no longer holds for them."""


def claim(holds: bool, message: str) -> None:
    """Refuses to render a passage whose wording `message` describes no longer holds."""
    if not holds:
        raise StaleClaim(message)


# ---------------------------------------------------------------------------------------------
# Reading the committed results


class Results:
    """The committed CSVs and configs under results/, each read once. `frames` replaces CSVs by
    path (tests use it to change a result)."""

    def __init__(self, root: Path = RESULTS, frames: dict[str, pd.DataFrame] | None = None):
        self.root = root
        self._frames = dict(frames or {})

    def csv(self, path: str) -> pd.DataFrame:
        if path not in self._frames:
            self._frames[path] = pd.read_csv(self.root / path)
        return self._frames[path]

    def config(self, run: str) -> dict[str, Any]:
        return tomllib.loads((self.root / run / "config.toml").read_text(encoding="utf-8"))


def _has(params: dict[str, Any], options: dict[str, Any]) -> bool:
    return all(params.get(key) == value for key, value in options.items())


def select(
    frame: pd.DataFrame,
    attack: str | None = None,
    defense: str | None = None,
    params: dict[str, Any] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Rows of a leaderboard or trials table: `attack` and `defense` by name, `params` the
    defense's parameters (all of them), `options` some of the attack's (None: not set)."""
    keep = pd.Series(True, index=frame.index)
    if attack is not None:
        keep &= frame["attack"] == attack
    if defense is not None:
        keep &= frame["defense"] == defense
    if params is not None:
        keep &= frame["defense_params"].map(lambda text: json.loads(text) == params)
    if options:
        keep &= frame["attack_params"].map(lambda text: _has(json.loads(text), options))
    return frame[keep]


def one(frame: pd.DataFrame, **where: Any) -> pd.Series:
    """The one row `select` finds."""
    found = select(frame, **where)
    if len(found) != 1:
        raise ReadmeError(f"expected one row where {where}, found {len(found)}")
    return found.iloc[0]


def recovered(row: pd.Series) -> int:
    """Images of a leaderboard row recovered within the success threshold."""
    return round(row["success_rate"] * row["n"])


# ---------------------------------------------------------------------------------------------
# Numbers as the README prints them


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def pct(share: float, digits: int = 0) -> str:
    """A share as a percentage: `pct(0.46875)` is "47%"."""
    return f"{100 * share:.{digits}f}%"


def acc(share: float) -> str:
    """An accuracy to 0.1 points, "100%" when exact."""
    return "100%" if share == 1 else f"{100 * share:.1f}%"


def acc_ci(share: float, half_width: float) -> str:
    """An accuracy and the half-width of its 95% interval: "93.8% ± 4.8"."""
    return f"{acc(share)} ± {100 * half_width:.1f}"


def decibels(psnr: float) -> str:
    """A PSNR to 0.1 dB; the floor of the metric, an exact reconstruction, prints as 100."""
    return "100" if psnr >= 100 else f"{psnr:.1f}"


def points(drop: float, digits: int = 1) -> str:
    """An accuracy difference in points."""
    return f"{100 * drop:.{digits}f}"


def count(number: float) -> str:
    """A count with thousands separated: "1,824"."""
    return f"{round(number):,}"


def sci(value: float) -> str:
    """A power-of-ten style number as the README writes it: "1e-2", "3e-3"."""
    mantissa, exponent = f"{value:.0e}".split("e")
    text = f"{mantissa}e{int(exponent)}"
    if not math.isclose(float(text), value, rel_tol=1e-6):
        raise ReadmeError(f"{value} has no one-digit form")
    return text


def rate(value: float) -> str:
    """A learning rate: "1e-2" below 1, "4" from 1 on."""
    return f"{value:g}" if value >= 1 else sci(value)


def listing(items: Sequence[str]) -> str:
    """Items joined as prose: "a", "a and b", "a, b and c"."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def whole_range(values: Sequence[float], unit: str = "") -> str:
    """Rounded values as a range, "19-20", or one number when they round alike."""
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return (low if low == high else f"{low}-{high}") + unit


def upper_bound(value: float) -> str:
    """A one-digit power-of-ten bound at or above `value`: 2.6e-6 gives "3e-6"."""
    exponent = math.floor(math.log10(value))
    return f"{math.ceil(value / 10**exponent - 1e-9)}e{exponent}"


def table_row(cells: Sequence[str]) -> str:
    """A Markdown table row; an empty cell is "| |"."""
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def wrap(text: str) -> str:
    """Fills each paragraph and list item of `text` (Markdown) to WIDTH columns; table rows stay
    as they are."""
    out: list[str] = []
    words: list[str] = []
    prefix = ""

    def flush() -> None:
        if words:
            out.append(
                textwrap.fill(
                    " ".join(words),
                    WIDTH,
                    initial_indent=prefix,
                    subsequent_indent=" " * len(prefix),
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
            words.clear()

    for line in textwrap.dedent(text).strip("\n").split("\n"):
        item = re.match(r" *- ", line)
        if not line.strip() or line.lstrip().startswith("|"):
            flush()
            out.append(line.rstrip())
        elif item:
            flush()
            prefix = item.group(0)
            words.append(line[len(prefix) :].strip())
        else:
            if not words:
                prefix = ""
            words.append(line.strip())
    flush()
    return "\n".join(out)


def fill(template: str, values: Mapping[str, Any]) -> str:
    """`template` with each named field replaced by its value; a field without a value, a value
    without a field, or a field with a format or an index is refused (the fillers print the
    numbers)."""
    fields = set()
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise ReadmeError(f"the field {{{field}}} is not a plain name")
        fields.add(field)
    if fields != set(values):
        missing, unused = sorted(fields - set(values)), sorted(set(values) - fields)
        raise ReadmeError(f"fields without a value {missing}, values without a field {unused}")
    return template.format_map(values)


# ---------------------------------------------------------------------------------------------
# The passages

Numbers = Callable[["Results"], Mapping[str, Any]]


class Passage(NamedTuple):
    """A generated passage: its name, the function giving its numbers, its template, whether it
    is a block (markers on lines of their own) rather than a span, and whether a block's prose is
    refilled."""

    name: str
    numbers: Numbers
    template: Path
    block: bool
    refill: bool

    def text(self, results: Results) -> str:
        """The passage's text between its markers."""
        template = self.template.read_text(encoding="utf-8").removesuffix("\n")
        body = fill(template, self.numbers(results))
        if self.block and self.refill:
            body = wrap(body)
        return f"\n{body}\n" if self.block else body


PASSAGES: dict[str, Passage] = {}


def _register(name: str, block: bool, refill: bool) -> Callable[[Numbers], Numbers]:
    def register(numbers: Numbers) -> Numbers:
        if name in PASSAGES:
            raise ValueError(f"passage {name} defined twice")
        template = Path(inspect.getfile(numbers)).parent / "passages" / f"{name}.md"
        PASSAGES[name] = Passage(name, numbers, template, block, refill)
        return numbers

    return register


def span(name: str) -> Callable[[Numbers], Numbers]:
    """Registers the function filling the span NAME."""
    return _register(name, block=False, refill=False)


def block(name: str, refill: bool = True) -> Callable[[Numbers], Numbers]:
    """Registers the function filling the block NAME."""
    return _register(name, block=True, refill=refill)


# ---------------------------------------------------------------------------------------------
# The default run (results/default), which other passages compare with

DEFAULT = "default"
PLAIN = {"match": "all", "loss": "l2"}
# The adaptive variants the planner adds: pruning and top-k bring match=kept, clipping and
# DP-SGD loss=cosine (each for both configured attacks).
KEPT = {"match": "kept", "loss": "l2"}
COSINE = {"match": "all", "loss": "cosine"}


def default_board(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/leaderboard.csv")


def default_trials(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/trials.csv")


def default_utility(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/utility.csv")


def trained_models(utility: pd.DataFrame) -> int:
    """Models trained per defense configuration (the same for all)."""
    per = utility.groupby(["defense", "defense_params"]).size()
    claim(per.nunique() == 1, "the defense configurations trained different numbers of models")
    return int(per.iloc[0])
