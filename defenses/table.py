"""The docs' defense table (``docs/defenses.md``), rendered from the registry.

One row per registered defense, sorted by name: its parameters as declared (a default in
parentheses) and its `Defense.summary`. ``tests/test_defense_table.py`` checks that the
committed page holds the table of the built-in defenses; ``python -m
leakbench.defenses.table docs/defenses.md`` writes it there.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from leakbench.core.params import declared
from leakbench.defenses.base import DEFENSES, Defense

# The table's place in a page: between these two lines.
BEGIN = "<!-- defense-table -->"
END = "<!-- /defense-table -->"
_BETWEEN = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def _parameters(cls: type[Defense]) -> str:
    """```sigma`, `percentile` (95)``: the declared parameters, a default in parentheses."""
    out = []
    for field, _ in declared(cls):
        text = f"`{field.name}`"
        if field.default is not dataclasses.MISSING:
            default = field.default
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            text += f" ({shown})"
        out.append(text)
    return ", ".join(out)


def _summary(cls: type[Defense]) -> str:
    lines = (cls.__doc__ or "").strip().splitlines()
    return cls.summary or (lines[0] if lines else "")


def defense_table(names: Iterable[str] | None = None) -> str:
    """The Markdown table of the defenses ``names`` (default: every registered one, plugins
    included), sorted by name, ending with a newline."""
    rows = ["| name | parameter | meaning |", "| --- | --- | --- |"]
    for name in sorted(DEFENSES.names() if names is None else names):
        cls = DEFENSES.get(name)
        parameters = _parameters(cls)
        rows.append(f"| `{name}` | {parameters + ' ' if parameters else ''}| {_summary(cls)} |")
    return "\n".join(rows) + "\n"


def built_in_names() -> list[str]:
    """The registered defenses that leakbench itself ships (no plugin's)."""
    return [n for n in DEFENSES.names() if DEFENSES.get(n).__module__.startswith(__package__ + ".")]


def table_in(page: str) -> str:
    """The table a page holds between `BEGIN` and `END`.

    Raises:
        ValueError: The page has no such place.
    """
    found = _BETWEEN.search(page)
    if found is None:
        raise ValueError(f"no {BEGIN} ... {END} block in the page")
    return found.group(1)


def with_table(page: str, table: str) -> str:
    """``page`` with ``table`` between `BEGIN` and `END`."""
    table_in(page)  # refuses a page without the place
    return _BETWEEN.sub(lambda _: f"{BEGIN}\n{table}{END}", page, count=1)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    path.write_text(with_table(path.read_text(encoding="utf-8"), defense_table(built_in_names())))
