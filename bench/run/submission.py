"""A board entry read as a hostile submission (`leakbench board`).

Nothing a submitted run directory says is believed when the board can recompute it:

1. **Read, never followed.** The directory is walked without following links; a symbolic link,
   a device or a FIFO anywhere inside it refuses the entry, and so do more than `MAX_FILES`
   files or more than `MAX_ENTRY_BYTES` in all. Only the files the numbers come from are
   copied (`SOURCES`, and ``arrays/*.npz``), each within its own cap (`FILE_CAPS`), into a
   scratch folder; the copy is what the board reads.
2. **Recomputed.** The copy's leaderboard is rebuilt from its ``config.toml``, ``trials.csv``,
   ``utility.csv`` and ``arrays/`` under this version's rules by the run's modality's pipeline
   (`leakbench.run.pipeline.Pipeline.rescore`, what `leakbench rescore` does), the epsilon
   audit's table joined as the run joined it; its trial rows must be of configurations its
   config plans (`check_planned`). The board shows the recomputed leaderboard, never the
   submitted one.
3. **Compared.** The submitted ``leaderboard.csv`` must say what the recomputation says, cell by
   cell (`COMPARED`): a verdict, a count or a rank that differs puts the entry apart, with the
   first difference named. Counts outside ``[0, n]``, non-finite numbers and unknown verdict
   words in the submitted file are reasons of their own.
4. **Checked against the arrays.** Every image row whose cell kept its arrays has its MSE and
   PSNR recomputed from the 8-bit original and reconstruction: both were clipped to [0, 1]
   before scoring and rounded to 1/255 after, so the root-mean-square error of the arrays is
   within `RMSE_ROUNDING` of the full-precision one (the triangle inequality). A row outside
   that, or a PSNR that is not its MSE's, puts the entry apart. Rows without arrays are counted
   and shown as unverifiable.

Any failure to parse (a file that is not UTF-8, not CSV, a missing column, a value of the wrong
type) is one reason line too: `EntryRefused`. The board catches it per entry and is always
built.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from leakbench.components.metrics import MSE_FLOOR
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import LeakbenchError
from leakbench.outputs.arrays import ARRAYS_DIR, load_cell, row_positions
from leakbench.outputs.board import short
from leakbench.outputs.leak_flags import CELL_COLUMNS
from leakbench.outputs.verdicts import VERDICTS
from leakbench.run.config import RunSpec, load_record
from leakbench.run.pipelines import pipeline_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The files a board entry's numbers come from, and what each may weigh at most.
FILE_CAPS = {
    "config.toml": 256 * 1024,
    "environment.json": 64 * 1024,
    "leaderboard.csv": 16 * 1024**2,
    "trials.csv": 256 * 1024**2,
    "utility.csv": 64 * 1024**2,
    "epsilon_audit.csv": 4 * 1024**2,
    "model_accuracy.json": 64 * 1024,
    "verification.json": 256 * 1024,
}
SOURCES = tuple(FILE_CAPS)
# One cell's arrays on disk, and inflated (the npz members' declared sizes, read before any
# member is inflated: a zip member never inflates beyond what it declares).
MAX_ARRAY_FILE = 64 * 1024**2
MAX_ARRAY_INFLATED = 512 * 1024**2
MAX_FILES = 20_000
MAX_ENTRY_BYTES = 2 * 1024**3
# A run directory's name as the board prints it.
MAX_NAME = 300

# Two 8-bit roundings (original and reconstruction), each at most half a level per pixel.
RMSE_ROUNDING = 1.0 / 255.0
PSNR_SLACK = 1e-3
# The submitted leaderboard's columns that must equal the recomputed ones, per cell.
COMPARED = ("n", "leaked_rate", "leaked_low", "leaked_high", "suite_leaked", "suite_n",
            "suite_low", "suite_high", "strongest", "verdict", "rank")  # fmt: skip


class EntryRefused(LeakbenchError):
    """An entry the board shows apart; the message is the one line why."""


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every path under ``root`` with its own status (links are not followed)."""
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as items:
            for item in items:
                path = Path(item.path)
                status = item.stat(follow_symlinks=False)
                yield path, status
                if stat.S_ISDIR(status.st_mode):
                    pending.append(path)


def safe_copy(folder: Path, scratch: Path) -> Path:
    """Copies what the board reads of the submission ``folder`` into ``scratch`` (module
    docstring, step 1) and returns the copy; `EntryRefused` says why it cannot."""
    name = str(folder)
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > MAX_NAME:
        raise EntryRefused(f"the name has control characters or more than {MAX_NAME} characters")
    try:
        top = folder.lstat()
    except OSError as err:
        raise EntryRefused(f"cannot be read ({err.strerror})") from None
    if stat.S_ISLNK(top.st_mode):
        raise EntryRefused("is a symbolic link; give the run directory itself")
    if not stat.S_ISDIR(top.st_mode):
        raise EntryRefused("is not a directory")
    files, total = 0, 0
    try:
        for path, status in _walk(folder):
            relative = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(status.st_mode):
                raise EntryRefused(f"holds a symbolic link ({relative}); links are not followed")
            if not (stat.S_ISDIR(status.st_mode) or stat.S_ISREG(status.st_mode)):
                raise EntryRefused(f"holds {relative}, which is not a regular file")
            files += 1
            total += status.st_size
            if files > MAX_FILES or total > MAX_ENTRY_BYTES:
                raise EntryRefused(
                    f"is larger than a board entry may be ({MAX_FILES} files, "
                    f"{MAX_ENTRY_BYTES // 1024**3} GiB)"
                )
    except OSError as err:
        raise EntryRefused(f"cannot be read ({err.strerror})") from None
    copy = scratch / "entry"
    (copy / ARRAYS_DIR).mkdir(parents=True)
    for source in SOURCES:
        _copy_capped(folder / source, copy / source, FILE_CAPS[source])
    arrays = folder / ARRAYS_DIR
    if arrays.is_dir():
        for item in sorted(arrays.iterdir()):
            if item.suffix == ".npz" and item.is_file():
                _copy_capped(item, copy / ARRAYS_DIR / item.name, MAX_ARRAY_FILE)
                _check_npz(copy / ARRAYS_DIR / item.name)
    return copy


def _copy_capped(source: Path, target: Path, cap: int) -> None:
    if not source.is_file():
        return
    size = source.stat().st_size
    if size > cap:
        raise EntryRefused(
            f"{source.name} weighs {size:,} bytes, more than the {cap:,} a board entry may hold"
        )
    shutil.copyfile(source, target, follow_symlinks=False)


def _check_npz(path: Path) -> None:
    """Refuses an arrays file that is no zip, or whose members would inflate beyond
    `MAX_ARRAY_INFLATED` (read from the declared sizes, before anything is inflated)."""
    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError):
        raise EntryRefused(f"{ARRAYS_DIR}/{path.name} is not an npz archive") from None
    if declared > MAX_ARRAY_INFLATED:
        raise EntryRefused(
            f"{ARRAYS_DIR}/{path.name} would inflate to {declared:,} bytes (at most "
            f"{MAX_ARRAY_INFLATED:,})"
        )


# Config keys whose "PREFIX:PATH" values name a file the recomputation would read.
PATH_KEYS = ("dataset", "model")


def check_paths(config: dict[str, object], roots: Sequence[Path]) -> None:
    """Refuses a config that names a data or model file outside ``roots`` (the directories the
    board's builder lets submissions read from): a submission must not make the board read an
    arbitrary file of the builder's machine. Nor may it make the board run its code
    (`check_plugins`)."""
    check_plugins(config)
    for key in PATH_KEYS:
        value = config.get(key)
        if not isinstance(value, str) or ":" not in value:
            continue
        path = value.split(":", 1)[1]
        try:
            resolved = Path(path).resolve()
        except (OSError, RuntimeError, ValueError):
            raise EntryRefused(f"config.toml's {key} names a path that does not resolve") from None
        if not any(resolved.is_relative_to(root.resolve()) for root in roots):
            allowed = ", ".join(str(r) for r in roots)
            raise EntryRefused(
                f"config.toml's {key} reads {short(path)}, outside the data roots the board "
                f"reads from ({short(allowed)}; `leakbench board --data-root DIR` adds one)"
            )


def check_plugins(config: Mapping[str, object]) -> None:
    """Refuses a config that names a plugin file (``*.py``): the board imports no code that a
    submission names. A plugin it loads is a module of an installed package, the builder's."""
    plugins = config.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else []:
        if isinstance(plugin, str) and plugin.endswith(".py"):
            raise EntryRefused(
                f"config.toml names the plugin file {short(plugin)}; the board imports no file a "
                "submission names (install the plugin as a package and name its module)"
            )


def load_submitted(config_file: Path, settings: Sequence[str] = ()) -> RunSpec:
    """`load_record` of a submitted run's ``config.toml``, after `check_plugins` of its text:
    a plugin file it names is refused before anything is imported."""
    try:
        config = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        config = {}  # load_record refuses it in its own words
    check_plugins(config)
    return load_record(config_file, settings)


def check_planned(copy: Path, trials: pd.DataFrame) -> None:
    """Refuses trial rows of an attack setting against a defense configuration that the
    entry's config does not plan (a defense renamed or relabelled in trials.csv and its arrays
    alike). Seeds and batches are not checked: an auditor's rows (the Flower integration's)
    number the round they attacked."""
    if trials.empty or "seed" not in trials:
        return

    pipeline = pipeline_for(load_submitted(copy / "config.toml"))
    planned = {
        (t.attack.name, canonical_json(t.attack.params()), t.defense.name,
         canonical_json(t.defense.params()))
        for t in pipeline.plan(pipeline.load())
    }  # fmt: skip
    cells = trials[["attack", "attack_params", "defense", "defense_params"]].drop_duplicates()
    for a, ap, d, dp in cells.itertuples(index=False):
        if (str(a), str(ap), str(d), str(dp)) not in planned:
            raise EntryRefused(
                f"trials.csv holds {short(f'{d} {dp}', 60)} attacked by "
                f"{short(f'{a} {ap}', 60)}, which its config.toml does not plan"
            )


def check_submitted_numbers(board: pd.DataFrame) -> None:
    """Refuses a submitted leaderboard whose numbers cannot be: counts outside ``[0, n]``,
    shares outside [0, 1], non-finite values where a number is due, unknown verdict words."""
    for count, total in (("suite_leaked", "suite_n"), ("n", "n")):
        if count not in board or total not in board:
            continue
        k = pd.to_numeric(board[count], errors="coerce")
        n = pd.to_numeric(board[total], errors="coerce")
        present = board[count].notna()
        bad = present & ~(np.isfinite(k) & np.isfinite(n) & (k >= 0) & (k <= n))
        if bad.any():
            row = board[bad].iloc[0]
            raise EntryRefused(
                f"leaderboard.csv: {count} {row[count]} is not a count between 0 and "
                f"{total} ({row[total]})"
            )
    for share in ("leaked_rate", "success_rate", "suite_low", "suite_high", "leaked_low",
                  "leaked_high"):  # fmt: skip
        if share not in board:
            continue
        values = pd.to_numeric(board[share], errors="coerce")
        bad = board[share].notna() & ~((values >= 0) & (values <= 1))
        if bad.any():
            raise EntryRefused(
                f"leaderboard.csv: {share} {board.loc[bad, share].iloc[0]} is not a share in [0, 1]"
            )
    if "verdict" in board:
        words = {str(v).strip().lower() for v in board["verdict"].dropna()}
        unknown = sorted(w for w in words if w not in {*VERDICTS, "nan", ""})
        if unknown:
            raise EntryRefused(
                f"leaderboard.csv: verdict {unknown[0][:40]!r} is not one of {', '.join(VERDICTS)}"
            )


def _same(a: object, b: object) -> bool:
    """Whether a submitted and a recomputed cell say the same (numbers to 1e-9 relative)."""
    x, y = pd.to_numeric(pd.Series([a, b]), errors="coerce")
    if not (math.isnan(x) and math.isnan(y)) and not (math.isnan(x) or math.isnan(y)):
        return bool(np.isclose(x, y, rtol=1e-9, atol=1e-12))
    blank = {"", "nan", "none"}
    left, right = str(a).strip().lower(), str(b).strip().lower()
    return left == right or (left in blank and right in blank)


def compare_leaderboards(submitted: pd.DataFrame, fresh: pd.DataFrame) -> str | None:
    """The first cell where the submitted leaderboard says other than the recomputed one, in
    one line; None when they agree on every cell and column of `COMPARED`."""
    keys = [*CELL_COLUMNS, *(["batch_size"] if "batch_size" in fresh else [])]
    missing = [k for k in keys if k not in submitted]
    if missing:
        return f"leaderboard.csv has no {missing[0]} column"
    said = submitted.assign(_key=_cell_keys(submitted, keys)).set_index("_key")
    got = fresh.assign(_key=_cell_keys(fresh, keys)).set_index("_key")
    if said.index.has_duplicates:
        return "leaderboard.csv lists a cell twice"
    extra = sorted(set(said.index) - set(got.index))
    if extra:
        return f"leaderboard.csv has a cell its trials do not hold ({extra[0][:120]})"
    absent = sorted(set(got.index) - set(said.index))
    if absent:
        return f"leaderboard.csv leaves out a cell its trials hold ({absent[0][:120]})"
    for key in got.index:
        for column in COMPARED:
            if column not in got:
                continue
            mine = got.at[key, column]
            theirs = said.at[key, column] if column in said else math.nan
            if not _same(theirs, mine):
                return (
                    f"leaderboard.csv says {column} = {str(theirs)[:40]} where its trials give "
                    f"{str(mine)[:40]} ({key[:120]})"
                )
    return None


def _cell_keys(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    """Each cell as one line that names its defense configuration and attack first (a reason
    is cut at 120 characters, and an attack's parameters alone can be longer)."""
    order = ["defense", "defense_params", "attack", *[k for k in keys if k not in
             ("defense", "defense_params", "attack")]]  # fmt: skip
    return [" | ".join(str(v) for v in row) for row in frame[order].itertuples(index=False)]


def check_against_arrays(run_dir: Path, trials: pd.DataFrame) -> tuple[int, int]:
    """Checks each image row's MSE and PSNR against its cell's arrays (module docstring, step
    4); returns (rows checked, rows without arrays). `EntryRefused` names the first row that
    disagrees."""
    if trials.empty or "mse" not in trials:  # a text run's rows: no image to check
        return 0, 0
    checked = 0
    for _, group in trials.groupby(CELL_COLUMNS, sort=False):
        cell = load_cell(run_dir, group.iloc[0])
        at = None if cell is None else row_positions(cell, group)
        if cell is None or at is None:
            continue
        original = cell.original[at].astype(np.float64) / 255.0
        recon = cell.reconstruction[at].astype(np.float64) / 255.0
        if original.shape != recon.shape or original.ndim != 4:
            raise EntryRefused(f"{ARRAYS_DIR}/: a cell's arrays are not two image batches")
        rmse = np.sqrt(((original - recon) ** 2).reshape(len(at), -1).mean(axis=1))
        claimed_mse = pd.to_numeric(group["mse"], errors="coerce").to_numpy(np.float64)
        claimed = np.sqrt(np.clip(claimed_mse, 0.0, None))
        wrong = ~(np.abs(rmse - claimed) <= RMSE_ROUNDING + 1e-9)
        if "psnr" in group:
            psnr = pd.to_numeric(group["psnr"], errors="coerce").to_numpy(np.float64)
            expected = 10.0 * np.log10(1.0 / np.maximum(claimed_mse, MSE_FLOOR))
            wrong |= ~(np.abs(psnr - expected) <= PSNR_SLACK)
        if wrong.any():
            row = group.iloc[int(np.flatnonzero(wrong)[0])]
            where = f"{row['defense']} {row['defense_params']}, {row['attack']}"
            raise EntryRefused(
                f"trials.csv: {int(wrong.sum())} rows' MSE or PSNR are not what arrays/ gives "
                f"(first: {where[:120]}, seed {row['seed']}, batch {row['batch_index']}, "
                f"position {row['position']}: mse {row['mse']})"
            )
        checked += len(at)
    return checked, len(trials) - checked


def recompute(copy: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The leaderboard of the entry's ``copy`` recomputed under this version's rules (module
    docstring, step 2) and its trials as recomputed; the copy's tables are rewritten."""
    for name in ("config.toml", "trials.csv", "utility.csv"):
        if not (copy / name).is_file():
            raise EntryRefused(f"no {name}; give run directories written by `leakbench run`")
    return pipeline_for(load_submitted(copy / "config.toml")).rescore(copy)
