"""Result tables: column declarations, the leaderboard aggregation and atomic CSV writing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import exact_interval
from leakbench.components.metrics import mean_ci95
from leakbench.outputs.leak_flags import CELL_COLUMNS, with_leak_flags
from leakbench.outputs.verdicts import (  # noqa: F401 (the rules' constants are read from here)
    BROKEN_SHARE,
    CONCLUSIVE_SHARE,
    MIN_BROKEN_IMAGES,
    RANKED_VERDICTS,
    SUITE_COLUMNS,
    VERDICT_RULE,
    VERDICTS,
    canonical_attack,
    rank_defenses,
    suite_union,
    vouched,
)

# Declared once; the CSVs always have exactly these columns in this order.
TRIAL_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_index", "position", "image_index", "batch_size", "label", "predicted_label", "mse",
    "psnr", "ssim", "lpips", "label_acc", "status", "loss", "iterations", "evaluations", "attempts",
    "seconds", "iterations_used", "stop_reason", "identified", "recognisable", "leaked",
    "distractors", "identified_null", "leak_matched", "truth_loss", "judged_loss", "converged",
    "escalations",
]  # fmt: skip
# What each added trial column holds (empty, NaN, in rows stored before it existed):
# ``identified_null``: the cell's measured chance of identification, the share of standing
#   null reconstructions (`leakbench.components.leakage`) identified among the same distractors;
# ``leak_matched``: 1 when the row's original is covered by a maximum-cardinality matching of its
#   batch's per-image leak graph (which reconstruction leaks which original), so that a cell's
#   leak count never trades exact matches for blends as the fidelity (MSE) assignment may;
# ``truth_loss`` / ``judged_loss``: the judge's matching loss of the true input and of the
#   reconstruction under the same observed update (never seen by the attacker);
# ``converged``: 1 when the reconstruction's judged loss is within the protocol's tolerance of
#   the truth's, 0 when the attack stopped well above it (after its escalations), NaN unjudged;
# ``escalations``: the reruns with more budget the judge asked for (0: none was needed).
# A trial's detection report (`leakbench.components.dsnr`), one row per trial, in
# detection.csv: written when the threat model asks for it (a malicious server, or detect).
# ``dsnr_threshold`` is the model family's (the pooled one outside the calibrated families);
# ``missed``: the server is malicious and no client flagged its model (empty in rows stored
# before the column existed).
DETECTION_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_index", "batch_size", "dsnr", "dsnr_layer", "dsnr_threshold", "flagged", "missed",
]  # fmt: skip
# Wall-time columns: the only ones that may differ between two runs of the same config.
TIMING_COLUMNS = ["seconds", "seconds_mean", "seconds_per_step"]
UTILITY_COLUMNS = [
    "run", "dataset", "model", "defense", "defense_params", "seed", "replicate", "recipe",
    "epochs", "batch_size", "optimizer", "learning_rates", "learning_rate", "validation_examples",
    "validation_accuracies", "validation_accuracy", "steps", "skipped_steps", "traces",
    "test_accuracy", "final_loss", "epsilon", "delta", "seconds_per_step", "epsilon_search",
]  # fmt: skip
# ``epsilon_search`` (added after ``seconds_per_step``): the epsilon of the whole learning-rate
# search, every searched rate's training composed (`leakbench.client.selection.Selection`).
DEFENSE_COLUMNS = ["dataset", "model", "defense", "defense_params"]
UTILITY_SUMMARY_COLUMNS = [
    "test_accuracy", "test_accuracy_ci95", "accuracy_drop", "epsilon", "delta", "skipped_steps",
]  # fmt: skip
LEADERBOARD_COLUMNS = [
    *CELL_COLUMNS, "n", "psnr_mean", "psnr_ci95", "psnr_median", "ssim_mean", "ssim_ci95",
    "lpips_mean", "lpips_ci95", "mse_mean", "mse_median", "label_acc", "success_rate",
    "identified_rate", "identified_chance", "recognisable_rate", "leaked_rate", "leaked_low",
    "leaked_high", "diverged", "errors", "seconds_mean", "budget_share", "converged_rate",
    "strongest", "vouched", "suite_leaked", "suite_n", "suite_low", "suite_high",
    *UTILITY_SUMMARY_COLUMNS, "rank", "pareto", "verdict", "verdict_note", "protocol",
    "epsilon_search",
]  # fmt: skip
# epsilon_audit.csv (`leakbench.run.epsilon_audit`): one row per defense configuration.
AUDIT_COLUMNS = [
    "dataset", "model", "defense", "defense_params", "seed", "batch_size", "rounds", "batches",
    "canaries", "canary_type", "canary_norm", "delta", "epsilon_update", "epsilon_exact",
    "epsilon_audit", "epsilon_audit_gdp", "mu_audit", "mu_estimate", "canary_mu", "bound_of",
    "epsilon_audit_confidence", "epsilon_audit_cap", "audit", "tpr_at_1pct_fpr", "auroc",
    "seconds",
]  # fmt: skip
# What a run with an epsilon audit adds to its leaderboard, after ``delta``.
AUDIT_BOARD_COLUMNS = [
    "epsilon_update", "epsilon_exact", "epsilon_audit", "epsilon_audit_gdp",
    "epsilon_audit_confidence", "audit",
]  # fmt: skip


def leaderboard_columns(audited: bool) -> list[str]:
    """The leaderboard's columns: `LEADERBOARD_COLUMNS`, with `AUDIT_BOARD_COLUMNS` after
    ``delta`` when the run audited its defenses (a run without an audit keeps its file as it
    was)."""
    if not audited:
        return list(LEADERBOARD_COLUMNS)
    at = LEADERBOARD_COLUMNS.index("delta") + 1
    return [*LEADERBOARD_COLUMNS[:at], *AUDIT_BOARD_COLUMNS, *LEADERBOARD_COLUMNS[at:]]


RANK_COLUMNS = ["rank", "pareto", "verdict", "verdict_note"]
# Leaderboard columns added after runs were committed: a leaderboard without them still reads
# (they are NaN there).
ADDED_COLUMNS = (
    "budget_share", "verdict", "test_accuracy_ci95", "lpips_mean", "lpips_ci95",
    "identified_rate", "identified_chance", "recognisable_rate", "leaked_rate", "leaked_low",
    "leaked_high", "verdict_note", "converged_rate", "vouched", "suite_leaked", "suite_n",
    "suite_low", "suite_high", "protocol", "epsilon_search",
)  # fmt: skip
# The accuracy a defense may cost and still be ranked (absolute, 0.05 = 5 points), unless the
# config's ``max_accuracy_drop`` says otherwise.
DEFAULT_MAX_ACCURACY_DROP = 0.05


def utility_summary(utility: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, defense, defense_params) of the utility trainings.

    Every trained model (each run seed and replicate, `leakbench.run.plan.Training`) counts once:
    ``test_accuracy`` is their mean and ``test_accuracy_ci95`` the half-width of its 95%
    Student-t interval (NaN for one model); ``accuracy_drop`` the mean of (accuracy of ``none``
    - accuracy of this defense) over models of the same dataset, model, seed and replicate (NaN
    when the run has no ``none``); ``skipped_steps`` the total; ``epsilon`` the largest (NaN for
    defenses without a DP guarantee), and ``epsilon_search`` the largest of the learning-rate
    searches' (NaN there too, and in utility tables written before it existed).
    """
    if utility.empty:
        return pd.DataFrame(columns=[*DEFENSE_COLUMNS, *UTILITY_SUMMARY_COLUMNS, "epsilon_search"])
    frame = utility.copy()
    if "epsilon_search" not in frame:
        frame["epsilon_search"] = np.nan  # utility tables written before the column existed
    if "replicate" not in frame:
        frame["replicate"] = 0  # utility tables written before replicates existed
    frame["replicate"] = frame["replicate"].fillna(0)
    pair = ["dataset", "model", "seed", "replicate"]
    clean = frame[frame["defense"] == "none"].set_index(pair)
    reference = frame.set_index(pair).index.map(clean["test_accuracy"].to_dict())
    frame["accuracy_drop"] = np.asarray(reference, dtype=float) - frame["test_accuracy"]
    summary = frame.groupby(DEFENSE_COLUMNS, sort=False).agg(
        test_accuracy=("test_accuracy", "mean"),
        test_accuracy_ci95=("test_accuracy", lambda x: mean_ci95(x.to_numpy(float))[1]),
        accuracy_drop=("accuracy_drop", "mean"),
        epsilon=("epsilon", "max"),
        delta=("delta", "first"),
        skipped_steps=("skipped_steps", "sum"),
        epsilon_search=("epsilon_search", "max"),
    )
    return summary.reset_index()


def leaderboard(
    trials: pd.DataFrame,
    success_mse: float = 1e-3,
    utility: pd.DataFrame | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    protocol: int = PROTOCOL,
) -> pd.DataFrame:
    """One row per (dataset, model, attack, attack_params, defense, defense_params) cell.

    ``n`` counts images; ``success_rate`` is the share with MSE <= ``success_mse`` (iDLG's
    fidelity threshold 1e-3 by default); ``identified_rate`` the share identified among the
    run's distractors (`leakbench.components.leakage`; NaN unless every image has the flag), with
    ``identified_chance`` the share a reconstruction unrelated to its image would reach;
    ``recognisable_rate`` the share under the recognisable threshold; ``leaked_rate`` the share
    with any of the three, and ``leaked_low``/``leaked_high`` its exact 95% interval.
    ``diverged`` and ``errors`` count images of trials with that status (their reconstructions
    are still scored, as the attacker would have them). ``strongest`` marks, among the attacks
    that ran on one (dataset, model, defense, defense_params), the one that leaked most: the
    highest ``leaked_rate``, ties broken by the highest ``success_rate``, then ``psnr_mean``,
    then by the attack listed first. That row is the defense's headline (a defense is only as
    private as its strongest attacker leaves it); every attack keeps its own row. The utility
    columns come from `utility_summary` (NaN when no training ran). ``converged_rate`` is the
    share of the cell's trials the judge found converged (NaN when none was judged);
    ``vouched`` whether the row's attack broke ``none`` (`leakbench.outputs.verdicts`); the
    ``suite_*`` columns the defense's per-image union over every attack; ``rank``, ``pareto``,
    ``verdict`` and ``verdict_note`` come from `rank_defenses`, and ``protocol`` is the suite
    protocol the verdicts follow (0: a run of listed attacks).
    """
    trials = with_leak_flags(trials, success_mse)
    rows = [
        _cell_row(cell, group, success_mse)
        for cell, group in trials.groupby(CELL_COLUMNS, sort=False)
    ]
    cell_columns = LEADERBOARD_COLUMNS[: LEADERBOARD_COLUMNS.index("strongest")]
    board = pd.DataFrame(rows, columns=cell_columns)
    board["strongest"] = strongest_attack(board)
    board["vouched"] = vouched(board, BROKEN_SHARE)
    good = {
        (r.dataset, r.model, canonical_attack(r.attack, r.attack_params))
        for r in board[board["vouched"]].itertuples()
    }
    # Rows without an image's identity (hand-made, or an auditor's) have no per-image union:
    # the strongest attack's count stands for it (`leakbench.outputs.verdicts.rank_defenses`).
    union = suite_union(trials, good) if {"seed", "image_index"} <= set(trials) else None
    if union is not None:
        board = board.merge(
            union[[*DEFENSE_COLUMNS, *SUITE_COLUMNS]], on=DEFENSE_COLUMNS, how="left"
        )
    if utility is not None and not utility.empty:
        board = board.merge(utility_summary(utility), on=DEFENSE_COLUMNS, how="left")
    board = board.reindex(columns=LEADERBOARD_COLUMNS)
    ranks = rank_defenses(board, max_accuracy_drop, protocol, union)
    for column in RANK_COLUMNS:
        board[column] = ranks[column]
    board["protocol"] = protocol
    return board


def _cell_row(cell: tuple[Any, ...], group: pd.DataFrame, success_mse: float) -> dict[str, Any]:
    """The leaderboard row of one cell's trial rows (see `leaderboard`), before the columns that
    compare cells."""
    leaked = int(group["leaked"].sum())
    leaked_low, leaked_high = exact_interval(leaked, len(group))
    identified_rate, _ = _complete_mean_ci95(group, "identified")
    psnr_mean, psnr_ci, n = mean_ci95(group["psnr"].to_numpy())
    ssim_mean, ssim_ci, _ = mean_ci95(group["ssim"].to_numpy())
    lpips_mean, lpips_ci = _complete_mean_ci95(group, "lpips")
    return {
        **dict(zip(CELL_COLUMNS, cell, strict=True)),
        "n": n,
        "psnr_mean": psnr_mean,
        "psnr_ci95": psnr_ci,
        "psnr_median": float(np.median(group["psnr"])),
        "ssim_mean": ssim_mean,
        "ssim_ci95": ssim_ci,
        "lpips_mean": lpips_mean,
        "lpips_ci95": lpips_ci,
        "mse_mean": float(group["mse"].mean()),
        "mse_median": float(group["mse"].median()),
        "label_acc": float(group["label_acc"].mean()),
        "success_rate": float((group["mse"] <= success_mse).mean()),
        "identified_rate": identified_rate,
        "identified_chance": identified_chance(group),
        "recognisable_rate": float(group["recognisable"].mean()),
        "leaked_rate": leaked / len(group),
        "leaked_low": leaked_low,
        "leaked_high": leaked_high,
        "diverged": int((group["status"] == "diverged").sum()),
        "errors": int((group["status"] == "error").sum()),
        "seconds_mean": float(group["seconds"].mean()),
        "budget_share": budget_share(group),
        "converged_rate": converged_rate(group),
    }


def identified_chance(group: pd.DataFrame) -> float:
    """A cell's chance of identification: the measured rate of its standing null
    reconstructions (``identified_null``) where the rows have it, else ``1 / (pool + 1)``."""
    if "identified_null" in group and group["identified_null"].notna().all():
        return float(group["identified_null"].iloc[0])
    return float(1.0 / (group["distractors"].iloc[0] + 1))


def _complete_mean_ci95(group: pd.DataFrame, column: str) -> tuple[float, float]:
    """Mean and 95% CI half-width of a score only when every image of the cell has it: a cell
    scored in part (LPIPS weights installed after some trials were stored) gets NaN rather
    than the mean of a subset."""
    if column not in group or group[column].isna().any():
        return float("nan"), float("nan")
    mean, half, _ = mean_ci95(group[column].to_numpy(float))
    return mean, half


def converged_rate(trials: pd.DataFrame) -> float:
    """The share of a cell's trials whose attack the judge found converged (``converged``),
    NaN when none was judged (an attack that optimises nothing, or rows stored before)."""
    if "converged" not in trials:
        return float("nan")
    per_trial = trials.drop_duplicates(["seed", "batch_index"])["converged"].astype(float)
    return float(per_trial.mean()) if per_trial.notna().any() else float("nan")


def budget_share(trials: pd.DataFrame) -> float:
    """The share of a cell's trials whose attack ended on its iteration budget rather than on a
    convergence test: the cap cut its search short (``budget``) or it has no test and ran its
    fixed schedule (``schedule``, `ig`). NaN for trials stored before ``stop_reason`` existed."""
    if "stop_reason" not in trials or trials["stop_reason"].isna().all():
        return float("nan")
    per_trial = trials.drop_duplicates(["seed", "batch_index"])
    return float(per_trial["stop_reason"].isin(ON_BUDGET).mean())


# Stop reasons that mean "ended on the iteration budget, not on convergence".
ON_BUDGET = ("budget", "schedule")


# A cell's strongest attack that hit its budget in more than this share of trials may have
# been stopped short of what it would have found.
BUDGET_WARNING_SHARE = 0.1


def budget_warning(board: pd.DataFrame) -> str | None:
    """One line for the CLI when a defense's strongest attack hit its iteration budget (rather
    than its convergence test, so the cell may understate the leakage) in more than
    `BUDGET_WARNING_SHARE` of its trials, else None."""
    headline = board[board["strongest"].astype(bool)]
    short = headline[headline["budget_share"] > BUDGET_WARNING_SHARE]
    if short.empty:
        return None
    # Short enough for 100 columns with the CLI's "leakbench: warning: " prefix: an attack
    # stopped by its budget, not its convergence test, may understate the leakage.
    return (
        f"{len(short)} cell(s) hit the iteration budget in >{BUDGET_WARNING_SHARE:.0%} of "
        "trials; raise iterations"
    )


def strongest_attack(board: pd.DataFrame) -> pd.Series:
    """True on each defense cell's strongest attack row (see `leaderboard`)."""
    flags = pd.Series(False, index=board.index, dtype=bool)
    if board.empty:
        return flags
    # A stable sort keeps the listed order among exact ties; NaN scores rank last.
    order = [c for c in ("leaked_rate", "success_rate", "psnr_mean") if c in board.columns]
    ranked = board.sort_values(order, ascending=False, kind="mergesort", na_position="last")
    first = ranked.groupby(DEFENSE_COLUMNS, sort=False).head(1).index
    flags.loc[first] = True
    return flags


def current_umask() -> int:
    """The process's file mode creation mask, read without changing it where possible.

    Linux (4.7 and later) reports it in ``/proc/self/status``. Elsewhere the only way is to set
    a mask and put the old one back, which is briefly visible to other threads; that is done
    only here, when a file is written, never at import.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass  # no /proc (or an unexpected line): fall back to setting and restoring
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions ``open(path, "w")`` would give a new file now: 0o666 less the umask."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **open_args: Any) -> Iterator[IO[Any]]:
    """An open handle whose contents replace ``path`` only when the block ends without error:
    written to a temporary file in the same folder, then ``os.replace``d, so a reader never
    sees a half-written file and a failure leaves the old file (or none) in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_args) as handle:
            # mkstemp creates files with mode 0600; results get the usual permissions of new
            # files instead (read now, so a umask set after import is honoured).
            os.fchmod(handle.fileno(), file_mode())
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(frame: pd.DataFrame, path: str | Path, columns: list[str]) -> None:
    """Writes ``frame[columns]`` to ``path`` atomically (`atomic_file`)."""
    with atomic_file(path, "w", newline="") as handle:
        frame.reindex(columns=columns).to_csv(handle, index=False)


def write_text(path: str | Path, text: str) -> None:
    """Writes text atomically, like `write_csv`."""
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)
