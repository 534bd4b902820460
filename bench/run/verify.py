"""`leakbench board`: the cross-run board, and ``--verify``, which checks one entry by
recomputing it.

Verification has two parts, both from what the run directory commits:

1. **Consistency.** The per-image flags and the leaderboard are recomputed from ``config.toml``,
   ``trials.csv``, ``utility.csv`` and ``arrays/`` in a scratch copy (as `leakbench rescore`
   does; no attack runs): every defense configuration must keep its verdict and its leaked
   count over the suite. An edited ``leaderboard.csv`` fails here.
2. **A seeded rerun.** One shard of the run's attack groups (``--share`` of them, which shard
   drawn from ``--seed``) runs again from ``config.toml`` into a scratch directory, utility
   training left out (the ``[training]`` recipe is kept: it trains the attacked model of a
   run with ``train_steps``). Each rerun image is compared with its committed row (same attack,
   defense, seed, batch and position) on the flags that depend on that image alone (recovered
   exactly, recognisable) and on its PSNR (within `PSNR_TOLERANCE` dB, or both above
   `EXACT_PSNR` dB). At most ``tolerance`` of the compared images may disagree. An edited
   ``trials.csv`` fails here when the sample holds an edited row.

The entry is ``verified`` when both pass, ``disputed`` otherwise; the result goes to
``RUN_DIR/verification.json`` (with the engine version that checked it and a hash of the
trials and leaderboard it vouches for), which the board reads: once the run is made again or
its tables change, the board counts the entry as not verified. An entry made by another
engine version is refused: its rerun would compare two engines' numbers, and a fix that made
an attack stronger would read as a dispute.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leakbench.core.errors import ConfigError
from leakbench.core.versions import ENGINE_VERSION, UNVERSIONED
from leakbench.outputs.board import VERIFICATION_FILE, build_board, load_entry, tables_sha256
from leakbench.outputs.board_html import write_board
from leakbench.outputs.naming import defense_label
from leakbench.outputs.tables import write_text
from leakbench.run.config import load_config
from leakbench.run.identification import rescore_run_dir
from leakbench.run.runner import run_benchmark
from leakbench.run.shard import Shard

PSNR_TOLERANCE = 1.0
EXACT_PSNR = 60.0
ROW_KEYS = ["attack", "attack_params", "defense", "defense_params", "seed", "batch_index",
            "position"]  # fmt: skip
CONFIG_KEYS = ["dataset", "model", "defense", "defense_params"]


def board_command(
    run_dirs: Sequence[str],
    out: str | None,
    verify: bool,
    share: float,
    seed: int,
    tolerance: float,
    progress: bool = False,
) -> list[str]:
    """What `leakbench board` does; returns the lines it prints (``progress``: the rerun of
    ``verify`` shows its progress bars on stderr). Bad input raises one `ConfigError` line
    before anything is written."""
    if verify:
        if len(run_dirs) != 1:
            raise ConfigError(f"board --verify takes one RUN_DIR, got {len(run_dirs)}")
        result = verify_entry(
            run_dirs[0], share=share, seed=seed, tolerance=tolerance, progress=progress
        )
        return [f"{run_dirs[0]}: {result['status']}; {result['summary']}"]
    if out is None:
        raise ConfigError("board: --out DIR is required (where the board is written)")
    board = build_board(run_dirs, root=Path.cwd())
    shown = run_dirs if len(run_dirs) <= 4 else [f"RUN_DIR... ({len(run_dirs)} run directories"
                                                 ": the run_dir column of board.csv)"]  # fmt: skip
    command = " ".join(["leakbench board", *shown, "--out", out])
    paths = write_board(board, Path(out), command)
    lines = [f"shown apart: {r.run_dir}: {r.reason}" for r in board.apart.itertuples()]
    lines.append(
        f"{len(board.rows)} rows in {board.rows['table'].nunique()} tables; "
        f"{len(board.apart)} run directories apart; wrote {', '.join(str(p) for p in paths)}"
    )
    return lines


def _check_share(share: float, tolerance: float) -> None:
    if not 0 < share <= 1:
        raise ConfigError(f"--share must be in (0, 1], got {share}")
    if not 0 <= tolerance <= 1:
        raise ConfigError(f"--tolerance must be in [0, 1], got {tolerance}")


def consistency(run_dir: Path, scratch: Path) -> list[str]:
    """The configurations whose verdict or suite count the committed files do not reproduce
    (one line each; empty: all do)."""
    copy = scratch / "rescored"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("store.sqlite*", "*.lock"))
    fresh = rescore_run_dir(copy)
    committed = pd.read_csv(run_dir / "leaderboard.csv")
    problems = []
    for key, rows in committed.groupby(CONFIG_KEYS, sort=False, dropna=False):
        mine = fresh
        for column, value in zip(CONFIG_KEYS, key, strict=True):
            mine = mine[mine[column] == value]
        label = defense_label(str(key[2]), str(key[3]))
        if mine.empty:
            problems.append(f"{label}: not in the recomputed leaderboard")
            continue
        said, got = rows.iloc[0], mine.iloc[0]
        if str(said["verdict"]) != str(got["verdict"]):
            problems.append(f"{label}: verdict {said['verdict']} recomputed as {got['verdict']}")
        count = "suite_leaked" if "suite_leaked" in rows else "leaked_rate"
        if not np.isclose(float(said[count]), float(got[count]), equal_nan=True):
            problems.append(f"{label}: {count} {said[count]} recomputed as {got[count]}")
    return problems


def _recovered(rows: pd.DataFrame, success_mse: float) -> pd.Series:
    return rows["mse"] <= success_mse


def compare_rows(
    committed: pd.DataFrame, rerun: pd.DataFrame, success_mse: float
) -> tuple[int, list[str]]:
    """How many rerun images have a committed row, and one line per image that disagrees."""
    keys = [k for k in ROW_KEYS if k in committed and k in rerun]
    joined = rerun.merge(committed, on=keys, how="inner", suffixes=("_rerun", "_committed"))
    problems = []
    for _, row in joined.iterrows():
        a, b = row["psnr_rerun"], row["psnr_committed"]
        close = abs(a - b) <= PSNR_TOLERANCE or (a >= EXACT_PSNR and b >= EXACT_PSNR)
        flags = [
            (row["mse_rerun"] <= success_mse) == (row["mse_committed"] <= success_mse),
            int(row["recognisable_rerun"]) == int(row["recognisable_committed"]),
        ]
        if not (close and all(flags)):
            where = f"{row['defense']} seed {row['seed']} batch {row['batch_index']}"
            problems.append(f"{where} position {row['position']}: PSNR {b:.2f} rerun {a:.2f}")
    return len(joined), problems


def rerun_sample(
    run_dir: Path, scratch: Path, share: float, seed: int, progress: bool = False
) -> tuple[pd.DataFrame, str]:
    """Reruns one seeded shard of the run's attack groups (with the run's progress bars when
    ``progress``); its trials and which shard."""
    count = max(1, int(round(1 / share)))
    index = int(np.random.default_rng(seed).integers(1, count + 1))
    shard = Shard(index, count)
    settings = []
    if not re.search(r"^suite\s*=", (run_dir / "config.toml").read_text(), re.MULTILINE):
        # A config written before the standard suite ran its listed attacks only.
        settings.append('suite="listed"')
    spec = load_config(run_dir / "config.toml", settings)
    result = run_benchmark(spec, scratch / "rerun", progress=progress, shard=shard, utility=False)
    trials = pd.read_csv(Path(result.out_dir) / "trials.csv")
    return trials, f"shard {shard}"


def verify_entry(
    run_dir: str | Path,
    *,
    share: float = 0.25,
    seed: int = 0,
    tolerance: float = 0.1,
    progress: bool = False,
) -> dict[str, Any]:
    """Verifies one run directory (module docstring) and writes ``verification.json``."""
    _check_share(share, tolerance)
    entry = load_entry(run_dir)
    engine = entry.environment.get("engine_version", UNVERSIONED)
    if str(engine) != str(ENGINE_VERSION):
        raise ConfigError(
            f"RUN_DIR {run_dir}: made by engine {engine}, and this is engine {ENGINE_VERSION}: "
            "its rerun would compare another engine's numbers; rerun the entry with this "
            "engine (results/README.md, 'Stale results'), then verify it"
        )
    path = entry.path
    spec = load_config(path / "config.toml")
    with tempfile.TemporaryDirectory(prefix="leakbench-verify-") as tmp:
        scratch = Path(tmp)
        problems = consistency(path, scratch)
        trials, sample = rerun_sample(path, scratch, share, seed, progress)
    committed = pd.read_csv(path / "trials.csv")
    compared, disagreements = compare_rows(committed, trials, spec.success_mse)
    allowed = math.floor(tolerance * compared)
    if compared == 0:
        problems.append(f"the rerun {sample} matched no committed trial row")
    elif len(disagreements) > allowed:
        problems.append(
            f"{len(disagreements)} of {compared} rerun images disagree (at most {allowed} "
            f"allowed); first: {disagreements[0]}"
        )
    status = "disputed" if problems else "verified"
    labels = {
        defense_label(str(d), str(p)): status
        for d, p in entry.leaderboard[["defense", "defense_params"]].drop_duplicates().to_numpy()
    }
    summary = (
        f"{sample} rerun, {compared} images compared, {len(disagreements)} disagree "
        f"(tolerance {tolerance:g}, PSNR within {PSNR_TOLERANCE:g} dB)"
        + (f"; {problems[0]}" if problems else "")
    )
    record = {
        "status": status,
        "engine_version": ENGINE_VERSION,
        "tables_sha256": tables_sha256(path),
        "summary": summary,
        "sample": sample,
        "seed": seed,
        "share": share,
        "tolerance": tolerance,
        "compared": compared,
        "disagreements": disagreements[:20],
        "problems": problems,
        "configurations": labels,
    }
    write_text(path / VERIFICATION_FILE, json.dumps(record, indent=2) + "\n")
    for line in problems:
        print(f"leakbench: disputed: {line}", file=sys.stderr)
    return record
