"""`leakbench board`: the cross-run board, and ``--verify``, which checks one entry by
recomputing it and rerunning a sample of it. What ``verified`` proves, and what it does not, is
in docs/board/submit.md ("What `verified` proves, and what it does not").

Verification has two parts, both from what the run directory commits, read as the board reads
a submission (`leakbench.run.board_build.read_submission`: copied without following links):

1. **Consistency.** The per-image flags and the leaderboard are recomputed from ``config.toml``,
   ``trials.csv``, ``utility.csv`` and ``arrays/`` (as `leakbench rescore` does; no attack
   runs) and must equal the submitted leaderboard cell by cell; every image row's MSE and PSNR
   must be what its arrays give. An edited ``leaderboard.csv``, or ``trials.csv`` scores edited
   without their arrays, fail here.
2. **A stratified rerun.** Attack groups are drawn with fresh randomness (``--seed`` only
   reproduces a recorded draw) so that every (defense configuration, attack setting) cell with
   rows has images rerun, adaptive settings included, plus random groups up to ``--share``;
   they run again from ``config.toml`` into a scratch directory, utility training left out (the
   ``[training]`` recipe is kept: it trains the attacked model of a run with ``train_steps``).
   Each rerun image is compared with its committed row (same attack, defense, seed, batch and
   position) on the flags that depend on that image alone (recovered exactly, recognisable)
   and on its PSNR (within `PSNR_TOLERANCE` dB, or both above `EXACT_PSNR` dB); a committed
   row the rerun does not give disagrees, and so does a rerun row without a committed row that
   leaks an image no committed row shows leaked (`compare_rows`). Per defense configuration, at most
   ``tolerance`` of its compared images may disagree. Trials edited consistently with their
   arrays (the scores, the arrays and the leaderboard all forged together) fail here, because
   every configuration is sampled and the sample cannot be known in advance.

A configuration is ``verified`` when the entry is consistent and its own comparison passes,
``disputed`` otherwise; a configuration with no image compared is not marked. The record goes
to the board builder's ledger (`leakbench.run.ledger`), keyed by the hash of the entry's files,
never into the run directory. An entry made by another engine version is refused: its rerun
would compare two engines' numbers, and a fix that made an attack stronger would read as a
dispute.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import secrets
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from leakbench.core.canonical import canonical_json
from leakbench.core.environment import ENVIRONMENT_FILE
from leakbench.core.errors import ConfigError
from leakbench.core.versions import ENGINE_VERSION, UNVERSIONED
from leakbench.outputs.board_html import write_board
from leakbench.outputs.naming import defense_label
from leakbench.run.board_build import UNREADABLE, build_board, print_progress, read_copy
from leakbench.run.ledger import LEDGER_FILE, add_record, entry_sha256, read_ledger
from leakbench.run.runner import run_benchmark
from leakbench.run.shard import Shard
from leakbench.run.stages import scored_leaks
from leakbench.run.submission import EntryRefused, load_submitted, safe_copy

T = TypeVar("T")

PSNR_TOLERANCE = 1.0
EXACT_PSNR = 60.0
ROW_KEYS = ["attack", "attack_params", "defense", "defense_params", "seed", "batch_index",
            "position"]  # fmt: skip
# A planned trial's identity in trials.csv: its cell, seed and batch.
TRIAL_KEYS = ROW_KEYS[:-1]


def ledger_path(ledger: str | None, out: str | None) -> Path | None:
    """Where the board's verifications are kept: ``--ledger``, else ``--out``'s
    `LEDGER_FILE`."""
    if ledger is not None:
        return Path(ledger)
    return None if out is None else Path(out) / LEDGER_FILE


def board_command(
    run_dirs: Sequence[str],
    out: str | None,
    verify: bool,
    share: float,
    seed: int | None,
    tolerance: float,
    progress: bool = False,
    ledger: str | None = None,
    data_roots: Sequence[str] = (),
) -> list[str]:
    """What `leakbench board` does; returns the lines it prints (``progress``: the entries
    read, and the rerun of ``verify``, show progress on stderr). Bad input raises one
    `ConfigError` line before anything is written; an entry that cannot stand is shown apart."""
    where = ledger_path(ledger, out)
    roots = [Path(r) for r in data_roots]
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"--data-root {root}: not a directory")
    if verify:
        if len(run_dirs) != 1:
            raise ConfigError(f"board --verify takes one RUN_DIR, got {len(run_dirs)}")
        if where is None:
            raise ConfigError(
                "board --verify: give --ledger FILE (or --out DIR), where the board keeps its "
                "own record of verifications"
            )
        result = verify_entry(
            run_dirs[0],
            where,
            share=share,
            seed=seed,
            tolerance=tolerance,
            progress=progress,
            data_roots=roots,
        )
        return [f"{run_dirs[0]}: {result['status']}; {result['summary']}"]
    if out is None:
        raise ConfigError("board: --out DIR is required (where the board is written)")
    records = read_ledger(where)
    board = build_board(
        run_dirs,
        root=Path.cwd(),
        ledger=records,
        progress=print_progress if progress else None,
        data_roots=roots,
    )
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


def _trial_key(trial: Any) -> tuple[str, str, str, str, int, int]:
    return (
        str(trial.attack.name),
        canonical_json(trial.attack.params()),
        str(trial.defense.name),
        canonical_json(trial.defense.params()),
        int(trial.seed),
        int(getattr(trial, "batch_index", 0)),
    )


def committed_keys(trials: pd.DataFrame) -> frozenset[tuple[str, str, str, str, int, int]]:
    """The planned trials a committed ``trials.csv`` holds rows of."""
    keys = trials[TRIAL_KEYS].drop_duplicates()
    return frozenset(
        (str(a), str(ap), str(d), str(dp), int(s), int(b))
        for a, ap, d, dp, s, b in keys.itertuples(index=False)
    )


@dataclasses.dataclass(frozen=True)
class Sample(Shard):
    """A stratified draw of a run's attack groups, used where a run takes a `Shard`: every cell
    (attack setting against defense configuration) the committed trials hold gets a group,
    then random groups until ``share`` of them; only groups whose trials were all committed are
    drawn while a cell has one (a staged run skips trials whose images had already leaked).
    ``draw`` seeds the choice; the run sees a shard that is never the whole run."""

    committed: frozenset[tuple[str, str, str, str, int, int]] = frozenset()
    share: float = 0.25
    draw: int = 0

    def take(self, items: Sequence[T]) -> list[T]:
        rng = np.random.default_rng(self.draw)
        complete: set[int] = set()
        cells: dict[tuple[str, str, str, str], list[int]] = {}
        for index, group in enumerate(items):
            keys = [_trial_key(t) for t in group]  # type: ignore[attr-defined]
            if all(k in self.committed for k in keys):
                complete.add(index)
            for key in keys:
                if key in self.committed:
                    cells.setdefault(key[:4], []).append(index)
        picked: set[int] = set()
        for cell in sorted(cells):
            if picked.intersection(cells[cell]):
                continue
            candidates = sorted(set(cells[cell]) & complete) or sorted(set(cells[cell]))
            picked.add(int(rng.choice(candidates)))
        rest = sorted(complete - picked)
        rng.shuffle(rest)
        want = math.ceil(self.share * len(complete))
        picked.update(rest[: max(0, want - len(picked))])
        return [items[i] for i in sorted(picked)]

    def __str__(self) -> str:
        return f"stratified draw {self.draw}"


def compare_rows(committed: pd.DataFrame, rerun: pd.DataFrame, success_mse: float) -> pd.DataFrame:
    """One row per image of the rerun's trials (and per committed image of those trials): its
    defense configuration and why it disagrees (empty when it agrees). A rerun row without a
    committed row disagrees only where it leaks an image that no committed row shows leaked
    (a staged run skips trials legitimately); others are left out."""
    keys = [k for k in ROW_KEYS if k in committed and k in rerun]
    ran = rerun[TRIAL_KEYS].drop_duplicates()
    mine = committed.merge(ran, on=TRIAL_KEYS, how="inner")
    joined = rerun.merge(
        mine, on=keys, how="outer", suffixes=("_rerun", "_committed"), indicator=True
    )
    # A staged run skips a later attack on a batch whose images leaked already, and `ig`
    # against a defense unless it broke `none` (`leakbench.run.stages`): a rerun row without a
    # committed row is therefore a disagreement only where it shows a leak that no committed row
    # of its image shows (what a deleted row could hide); otherwise it is not compared.
    image = ["defense", "defense_params", "seed", "batch_index", "position"]
    leaked = committed[scored_leaks(committed, success_mse)][image].itertuples(index=False)
    known = {tuple(str(v) for v in key) for key in leaked}
    new = joined["_merge"].eq("left_only")
    scores = joined[["mse_rerun", "psnr_rerun"]].set_axis(["mse", "psnr"], axis=1)
    if "lpips_rerun" in joined:
        scores = scores.assign(lpips=joined["lpips_rerun"])
    hidden = pd.Series(scored_leaks(scores, success_mse), index=joined.index) & ~pd.Series(
        [tuple(str(v) for v in key) in known for key in joined[image].itertuples(index=False)],
        index=joined.index,
        dtype=bool,
    )
    skipped = new & ~hidden
    joined = joined[~skipped]
    reasons = []
    for _, row in joined.iterrows():
        where = (
            f"{row['defense']} {row['defense_params']} {row['attack']} seed {row['seed']} "
            f"batch {row['batch_index']} position {row['position']}"
        )
        if row["_merge"] == "left_only":
            reasons.append(f"{where}: rerun leaks it, with no committed row that does")
            continue
        if row["_merge"] == "right_only":
            reasons.append(f"{where}: committed, and the rerun gives no such row")
            continue
        a, b = float(row["psnr_rerun"]), float(row["psnr_committed"])
        close = abs(a - b) <= PSNR_TOLERANCE or (a >= EXACT_PSNR and b >= EXACT_PSNR)
        flags = [
            (row["mse_rerun"] <= success_mse) == (row["mse_committed"] <= success_mse),
            int(row["recognisable_rerun"]) == int(row["recognisable_committed"]),
        ]
        reasons.append("" if close and all(flags) else f"{where}: PSNR {b:.2f} rerun {a:.2f}")
    labels = [defense_label(str(d), str(p)) for d, p in zip(joined["defense"],
              joined["defense_params"], strict=True)]  # fmt: skip
    return pd.DataFrame({"configuration": labels, "problem": reasons})


def rerun_sample(copy: Path, scratch: Path, sample: Sample, progress: bool = False) -> pd.DataFrame:
    """Reruns the drawn groups of the entry's ``copy`` (with the run's progress bars when
    ``progress``); their trials."""
    settings = []
    if not re.search(r"^suite\s*=", (copy / "config.toml").read_text(), re.MULTILINE):
        # A config written before the standard suite ran its listed attacks only.
        settings.append('suite="listed"')
    spec = load_submitted(copy / "config.toml", settings)
    result = run_benchmark(spec, scratch / "rerun", progress=progress, shard=sample, utility=False)
    return pd.read_csv(Path(result.out_dir) / "trials.csv")


def read_environment(copy: Path) -> dict[str, Any]:
    """The copy's ``environment.json`` (empty when absent or not a JSON object)."""
    path = copy / ENVIRONMENT_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def folder_copy(folder: Path, scratch: Path) -> Path:
    """A second safe copy of ``folder`` to rerun from (the first was rewritten by the
    recomputation)."""
    return safe_copy(folder, scratch / "second")


def judge_configurations(
    compared: pd.DataFrame, tolerance: float, consistent: bool
) -> dict[str, dict[str, Any]]:
    """Per defense configuration compared: its images, its disagreements and its status (at
    most ``tolerance`` of its images may disagree, and the entry must be ``consistent``)."""
    result = {}
    for label, rows in compared.groupby("configuration", sort=True):
        bad = int((rows["problem"] != "").sum())
        allowed = math.floor(tolerance * len(rows))
        ok = consistent and bad <= allowed
        result[str(label)] = {
            "status": "verified" if ok else "disputed",
            "compared": len(rows),
            "disagree": bad,
        }
    return result


def verify_entry(
    run_dir: str | Path,
    ledger: Path,
    *,
    share: float = 0.25,
    seed: int | None = None,
    tolerance: float = 0.1,
    progress: bool = False,
    data_roots: Sequence[Path] = (),
) -> dict[str, Any]:
    """Verifies one run directory (module docstring) and records the result in ``ledger``."""
    _check_share(share, tolerance)
    folder = Path(run_dir)
    draw = secrets.randbits(63) if seed is None else int(seed)
    with tempfile.TemporaryDirectory(prefix="leakbench-verify-") as tmp:
        scratch = Path(tmp)
        try:
            copy = safe_copy(folder, scratch)
        except EntryRefused as err:
            raise ConfigError(f"RUN_DIR {run_dir}: {err}") from None
        key = entry_sha256(copy)
        committed = pd.read_csv(copy / "trials.csv") if (copy / "trials.csv").is_file() else None
        environment = read_environment(copy)
        engine = environment.get("engine_version", UNVERSIONED)
        if str(engine) != str(ENGINE_VERSION):
            raise ConfigError(
                f"RUN_DIR {run_dir}: made by engine {engine}, and this is engine "
                f"{ENGINE_VERSION}: its rerun would compare another engine's numbers; rerun the "
                "entry with this engine (results/README.md, 'Stale results'), then verify it"
            )
        problems: list[str] = []
        try:
            read_copy(copy, folder, data_roots)
        except UNREADABLE as err:
            problems.append(str(err).splitlines()[0][:300] if str(err) else type(err).__name__)
        if committed is None:
            raise ConfigError(f"RUN_DIR {run_dir}: no trials.csv; nothing to rerun")
        sample = Sample(1, 2, committed=committed_keys(committed), share=share, draw=draw)
        second = folder_copy(folder, scratch)
        spec = load_submitted(second / "config.toml")  # the copy's: the submission is read once
        rerun = rerun_sample(second, scratch, sample, progress)
    compared = compare_rows(committed, rerun, spec.success_mse)
    configurations = judge_configurations(compared, tolerance, not problems)
    disputed = [k for k, v in configurations.items() if v["status"] != "verified"]
    if compared.empty:
        problems.append("the rerun compared no image")
    status = "disputed" if problems or disputed else "verified"
    disagreements = [p for p in compared["problem"] if p]
    summary = (
        f"draw {draw} (--seed {draw} reproduces it), {len(rerun)} images rerun, "
        f"{len(compared)} compared over {len(configurations)} configurations, "
        f"{len(disagreements)} disagree (tolerance {tolerance:g} per configuration, PSNR within "
        f"{PSNR_TOLERANCE:g} dB)"
        + (f"; disputed: {', '.join(disputed)}" if disputed else "")
        + (f"; {problems[0]}" if problems else "")
    )
    record = {
        "status": status,
        "run_dir": str(run_dir),
        "engine_version": ENGINE_VERSION,
        "entry_sha256": key,
        "checked_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "summary": summary,
        "draw": draw,
        "share": share,
        "tolerance": tolerance,
        "compared": len(compared),
        "disagreements": disagreements[:20],
        "problems": problems,
        "configurations": configurations,
    }
    add_record(ledger, key, record)
    for line in [*problems, *disagreements[:5]]:
        print(f"leakbench: disputed: {line}", file=sys.stderr)
    return record
