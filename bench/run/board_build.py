"""Building the cross-run board from submitted run directories (`leakbench board`).

Each directory is read as a hostile submission (`leakbench.run.submission`): copied without
following links, its leaderboard recomputed from its trials and arrays and compared with what
it says. An entry that cannot stand (refused, unreadable, or saying other than its own trials)
is shown apart with one line why; the board is built from the others, always. Verifications
come from the board builder's ledger (`leakbench.run.ledger`), never from the submission.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.outputs.board import (
    BOARD_COLUMNS,
    Board,
    Entry,
    apart_reason,
    entry_rows,
    load_entry,
    rank_in_tables,
    read_table,
    short,
    table_order,
)
from leakbench.run.ledger import entry_sha256
from leakbench.run.submission import (
    EntryRefused,
    check_against_arrays,
    check_paths,
    check_planned,
    check_submitted_numbers,
    compare_leaderboards,
    recompute,
    safe_copy,
)

# What a malformed file raises while pandas, json, tomllib or the recomputation read it: each
# is one reason line for its entry, never the end of the board. (UnicodeDecodeError, pandas'
# ParserError and EmptyDataError and json's JSONDecodeError are ValueErrors.)
UNREADABLE = (
    LeakbenchError, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
    RecursionError, OSError, zipfile.BadZipFile,
)  # fmt: skip
MAX_REASON = 300


def read_submission(folder: Path, scratch: Path, roots: Sequence[Path] = ()) -> Entry:
    """The entry of the submitted run directory ``folder`` as the board shows it: read from a
    safe copy, its leaderboard recomputed and checked (`leakbench.run.submission`).
    `EntryRefused` (or a parse error) says why it cannot stand."""
    return read_copy(safe_copy(folder, scratch), folder, roots)


def read_copy(copy: Path, folder: Path, roots: Sequence[Path] = ()) -> Entry:
    """`read_submission` of the safe ``copy`` (`leakbench.run.submission.safe_copy`) of the
    submitted ``folder``; the copy's tables are rewritten by the recomputation. ``roots``: the
    directories a config may name data or model files under (the working directory always)."""
    key = entry_sha256(copy)
    entry = load_entry(copy, str(folder))
    check_paths(entry.config, [Path.cwd(), *roots])
    reason = apart_reason(entry)
    if reason:
        raise EntryRefused(reason)
    check_submitted_numbers(entry.leaderboard)
    if not (copy / "trials.csv").is_file():
        raise EntryRefused("no trials.csv; give run directories written by `leakbench run`")
    # The scores first: a leaderboard recomputed from edited scores would disagree too, but
    # the arrays say which rows were edited.
    trials = read_table(copy / "trials.csv", str(folder))
    checked, unchecked = check_against_arrays(copy, trials)
    # The rows of every modality must be of configurations its config plans.
    check_planned(copy, trials)
    fresh, _ = recompute(copy)
    difference = compare_leaderboards(entry.leaderboard, fresh)
    if difference:
        raise EntryRefused(difference)
    return dataclasses.replace(
        entry,
        path=folder,
        leaderboard=fresh,
        entry_sha256=key,
        checkpoint=entry.checkpoint or folder.parent.name == "checkpoints",
        rows_checked=checked,
        rows_unchecked=unchecked,
    )


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if not isinstance(err, LeakbenchError):
        text = f"a file does not parse ({type(err).__name__}: {text})"
    return short(re.sub(r"^RUN_DIR \S+: ", "", text), MAX_REASON)


def build_board(
    folders: Sequence[str | Path],
    root: Path | None = None,
    ledger: dict[str, dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
    data_roots: Sequence[Path] = (),
) -> Board:
    """Reads every run directory and joins the rows of those that stand; the others are apart
    with one line each. ``root`` makes the recorded run folders relative to it; ``ledger`` holds
    the board's verifications by entry hash; ``progress`` hears of each entry read;
    ``data_roots`` are where, besides the working directory, a config may name data files."""
    if not folders:
        raise ConfigError("RUN_DIR: give at least one run directory (none was given)")
    rows: list[dict[str, Any]] = []
    apart: list[dict[str, str]] = []
    for number, folder in enumerate(folders, start=1):
        run_dir = _relative(Path(folder), root)
        if progress is not None:
            progress(f"[{number}/{len(folders)}] {run_dir}")
        with tempfile.TemporaryDirectory(prefix="leakbench-board-") as tmp:
            try:
                entry = read_submission(Path(folder), Path(tmp), data_roots)
                record = (ledger or {}).get(entry.entry_sha256)
                rows.extend(entry_rows(entry, run_dir, record))
            except UNREADABLE as err:
                apart.append({"run_dir": short(run_dir, MAX_REASON), "reason": _reason(err)})
    frame = sort_rows(pd.DataFrame(rows, columns=BOARD_COLUMNS))
    frame["table_rank"] = rank_in_tables(frame)
    frame = sort_rows(frame)
    return Board(frame, pd.DataFrame(apart, columns=["run_dir", "reason"]))


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers inside ``text`` by value (``epoch-2`` before
    ``epoch-10``)."""
    parts = re.split(r"(\d+)", str(text))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts if p)


def sort_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The board's rows: tables in `table_order`, each in rank order, its unranked rows after
    the ranked ones by model and model state (numbers in names by value)."""
    if frame.empty:
        return frame.reset_index(drop=True)
    rank = pd.to_numeric(frame["table_rank"], errors="coerce")
    keys = list(
        zip(
            frame["table"].map(table_order),
            rank.isna(),
            rank.fillna(0),
            frame["model"].astype(str),
            frame["model_state"].map(natural_key),
            strict=True,
        )
    )
    order = sorted(range(len(frame)), key=keys.__getitem__)
    return frame.iloc[order].reset_index(drop=True)


def _relative(path: Path, root: Path | None) -> str:
    """The run folder as the board records it: relative to ``root`` where it lies under it."""
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except (ValueError, OSError):
            pass
    return path.as_posix()


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
