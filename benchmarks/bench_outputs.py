"""What the benchmark scripts write: CSV tables beside a run record, each file replaced
atomically (`leakbench.core.files.atomic_file`), so an interrupted script leaves the old
file or none. The scripts import it from their own folder."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leakbench.core.environment import script_command, write_run_record
from leakbench.core.files import atomic_file


def write_rows(path: Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Writes ``rows`` under the header ``columns`` to ``path`` (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def write_summary_and_series(
    out: Path,
    summary: tuple[Sequence[str], dict[str, Any]],
    series: tuple[Sequence[str], Sequence[Sequence[Any]]],
    script: str,
    argv: Sequence[str] | None,
) -> None:
    """A steady-state benchmark's outputs: its one-row summary at ``out``, the per-step series
    beside it (``<stem>_series<suffix>``) and the run record naming both and the command."""
    columns, row = summary
    write_rows(out, columns, [[row[c] for c in columns]])
    series_path = out.with_name(f"{out.stem}_series{out.suffix}")
    write_rows(series_path, *series)
    write_run_record(out.parent, f"{out.name}, {series_path.name}", script_command(script, argv))
    print(f"wrote {out} and {series_path}")
