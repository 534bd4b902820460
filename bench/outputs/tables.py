"""Result tables of every modality: column declarations (`Tables`: an image run's, `IMAGE`, and
a text run's, `TEXT`), the leaderboard aggregation and atomic CSV writing.

A text trial row is one private sentence under one (batch size, defense, attack): its scores
(`leakbench.components.text_metrics`: ROUGE-1/2/L F, exact recovery, token accuracy in place,
``leaked``), the bag-of-words precision and recall of the reconstruction's words against the
batch's (the same for every sentence of a batch), and the attack's ``stop_reason`` and ``note``
(e.g. "beyond rank"). Its leaderboard has one row per (dataset, model, batch size, attack,
defense) cell: batch size is part of a text run's setting, since it attacks several and a
defense that holds at B = 16 may leak at B = 1. Its utility is the perplexity of the defense's
trained model on held-out private sentences (lower is better).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import exact_interval
from leakbench.components.metrics import mean_ci95
from leakbench.core.files import atomic_file
from leakbench.outputs.guarantees import (
    GUARANTEE_COLUMNS,
    WORD_COLUMNS,
    guarantee_columns,
    word_columns,
)
from leakbench.outputs.leak_flags import CELL_COLUMNS, cell_chance, with_leak_flags
from leakbench.outputs.verdicts import (  # noqa: F401 (the rules' constants are read from here)
    BROKEN_SHARE,
    CONCLUSIVE_SHARE,
    MIN_BROKEN_IMAGES,
    MIN_HOLDS_SEEDS,
    RANKED_VERDICTS,
    SETTING,
    SUITE_COLUMNS,
    TEXT_SETTING,
    VERDICT_RULE,
    VERDICTS,
    attack_keys,
    rank_defenses,
    rank_text_defenses,
    suite_union,
    vouch_share,
    vouched,
)

# Declared once; the CSVs always have exactly these columns in this order.
TRIAL_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_index", "position", "image_index", "batch_size", "label", "predicted_label", "mse",
    "psnr", "ssim", "lpips", "label_acc", "status", "loss", "iterations", "evaluations", "attempts",
    "seconds", "iterations_used", "stop_reason", "identified", "recognisable", "leaked",
    "distractors", "identified_null", "leak_matched", "truth_loss", "judged_loss", "converged",
    "escalations", "null_psnr", "null_lpips", "over_null",
]  # fmt: skip
# What each added trial column holds (empty, NaN, in rows stored before it existed):
# ``null_psnr``, ``null_lpips``, ``over_null``: the label-only null's scores and whether the
#   reconstruction beats it where it is recognisable (`leakbench.run.identification.label_floors`);
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
# ``dsnr`` and ``dsnr_threshold`` are those of the layer that stands out most against its kind's
# threshold (`leakbench.components.dsnr.detect`);
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
    "rates_tried", "rate_at_edge",
]  # fmt: skip
# ``epsilon_search`` (added after ``seconds_per_step``): the epsilon of the whole learning-rate
# search, every searched rate's training composed (`leakbench.client.selection.Selection`);
# ``rates_tried`` and ``rate_at_edge`` (engine 9): every rate trained, the grid's and those past
# its edge, and whether the kept one is still at an edge of them.
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
    "epsilon_search", *GUARANTEE_COLUMNS,
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


TEXT_TRIAL_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_size", "batch_index", "position", "sentence_index", "text", "reconstruction",
    "rouge1", "rouge2", "rougeL", "exact", "token_accuracy", "leaked", "matched",
    "bag_precision", "bag_recall", "loss", "stop_reason", "iterations_used", "budget", "note",
    "seconds",
]  # fmt: skip
TEXT_UTILITY_COLUMNS = [
    "run", "dataset", "model", "defense", "defense_params", "seed", "perplexity",
    "next_token_accuracy", "initial_perplexity", "steps", "skipped_steps", "epsilon", "delta",
    "seconds",
]  # fmt: skip
TEXT_LEADERBOARD_COLUMNS = [
    "dataset", "model", "batch_size", "attack", "attack_params", "defense", "defense_params",
    "n", "rouge1_mean", "rouge2_mean", "rougeL_mean", "exact_rate", "token_accuracy_mean",
    "bag_precision_mean", "bag_recall_mean", "leaked_rate", "leaked_low", "leaked_high",
    "seconds_mean", "notes", "strongest", "vouched", "suite_leaked", "suite_n", "suite_low",
    "suite_high", "perplexity", "next_token_accuracy", "epsilon", "rank", "verdict",
    "verdict_note", "protocol", *WORD_COLUMNS,
]  # fmt: skip
# Leaderboard columns added after runs were committed: a leaderboard without them still reads
# (they are NaN there).
ADDED_COLUMNS = (
    "budget_share", "verdict", "test_accuracy_ci95", "lpips_mean", "lpips_ci95",
    "identified_rate", "identified_chance", "recognisable_rate", "leaked_rate", "leaked_low",
    "leaked_high", "verdict_note", "converged_rate", "vouched", "suite_leaked", "suite_n",
    "suite_low", "suite_high", "protocol", "epsilon_search", *GUARANTEE_COLUMNS, *WORD_COLUMNS,
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


def _text_utility(utility: pd.DataFrame) -> pd.DataFrame:
    """A text run's utility per defense configuration: the mean perplexity and next-token
    accuracy of its trained models, and the largest epsilon."""
    means = utility.groupby(DEFENSE_COLUMNS, sort=False).agg(
        perplexity=("perplexity", "mean"),
        next_token_accuracy=("next_token_accuracy", "mean"),
        epsilon=("epsilon", "max"),
    )
    return means.reset_index()


def leaderboard(
    trials: pd.DataFrame,
    success_mse: float = 1e-3,
    utility: pd.DataFrame | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    protocol: int = PROTOCOL,
    modality: str | None = None,
    *,
    classes: int | None = None,
    clients: int = 1,
    releases: int = 1,
) -> pd.DataFrame:
    """One row per cell of the trials of ``modality`` (`TABLES`; by default the one their
    columns name, `modality_of`): for an image run per (dataset, model, attack, attack_params,
    defense, defense_params), as below; for a text run per (dataset, model, batch size, attack,
    defense) with the text scores' means, the suite union, the perplexity and the verdicts and
    ranks of `leakbench.outputs.verdicts.rank_text_defenses` (``success_mse`` and
    ``max_accuracy_drop`` are the image run's).

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
    protocol the verdicts follow (0: a run of listed attacks). An image run's rows carry
    `leakbench.outputs.guarantees`' label and DP-ceiling columns, per defense configuration
    (``classes``: the dataset's, None where unknown; ``clients`` and ``releases``: the clients
    averaged and the noisy local steps behind an update); under any protocol but 1 its note
    joins the verdict note.
    """
    tables = TABLES[modality] if modality else modality_of(trials.columns)
    trials = tables.flags(trials, success_mse, protocol)
    board = _cells(trials, tables, success_mse)
    board["strongest"] = strongest_attack(board, tables.strongest_by, tables.defense_columns)
    board["vouched"] = vouched(board, vouch_share(protocol), tables.setting)
    good = set(attack_keys(board[board["vouched"]], tables.setting))
    # Rows without an image's identity (hand-made, or an auditor's) have no per-image union:
    # the strongest attack's count stands for it (`leakbench.outputs.verdicts.rank_defenses`).
    union = None
    if {"seed", tables.item} <= set(trials):
        union = suite_union(trials, good, tables.setting, tables.item, protocol)
        keys = tables.defense_columns
        board = board.merge(union[[*keys, *SUITE_COLUMNS]], on=keys, how="left")
    if utility is not None and not utility.empty:
        board = board.merge(tables.utility_summary(utility), on=DEFENSE_COLUMNS, how="left")
    board = board.reindex(columns=tables.board_columns)
    ranks = tables.rank(board, max_accuracy_drop, protocol, union)
    for column in ranks:
        board[column] = ranks[column]
    board["protocol"] = protocol
    if tables.modality == "image" and len(board):
        board = _with_guarantees(board, trials, protocol, classes, clients, releases)
    if tables.modality == "text" and len(board):
        board = _with_words(board, trials, protocol, tables.defense_columns)
    return board


def _with_words(
    board: pd.DataFrame, trials: pd.DataFrame, protocol: int, setting: list[str]
) -> pd.DataFrame:
    """A text ``board`` with `leakbench.outputs.guarantees.word_columns` per setting and, under
    any protocol but 1, its note after the verdict note."""
    merged = board[setting].merge(word_columns(trials, setting), on=setting, how="left")
    for column in WORD_COLUMNS:
        board[column] = merged[column].to_numpy()
    if protocol != 1:
        _append_notes(board, merged["note"])
    return board


def _with_guarantees(
    board: pd.DataFrame,
    trials: pd.DataFrame,
    protocol: int,
    classes: int | None,
    clients: int,
    releases: int,
) -> pd.DataFrame:
    """``board`` with `leakbench.outputs.guarantees`' columns filled per defense configuration
    and, under any protocol but 1, their note after the verdict note."""
    facts = guarantee_columns(trials, classes, clients, releases)
    keys = DEFENSE_COLUMNS
    merged = board[keys].merge(facts, on=keys, how="left")
    for column in GUARANTEE_COLUMNS:
        board[column] = merged[column].to_numpy()
    if protocol != 1:
        _append_notes(board, merged["note"])
    return board


def _append_notes(board: pd.DataFrame, notes: pd.Series) -> None:
    """Adds each of ``notes`` (aligned with ``board``'s rows) after the row's verdict note."""
    old = board["verdict_note"].fillna("").astype(str).to_numpy()
    new = notes.fillna("").to_numpy()
    board["verdict_note"] = [f"{a}; {b}" if a and b else (a or b)
                             for a, b in zip(old, new, strict=True)]  # fmt: skip


def _cells(trials: pd.DataFrame, tables: Tables, success_mse: float) -> pd.DataFrame:
    """The leaderboard's rows of ``trials``' cells (see `leaderboard`), before the columns that
    compare cells: the modality's scores (`Tables.cell_row`), the share leaked with its exact
    95% interval, and the mean seconds."""
    rows = []
    for cell, group in trials.groupby(tables.cell_columns, sort=False):
        leaked = int(group["leaked"].astype(float).sum())
        low, high = exact_interval(leaked, len(group))
        rows.append(
            {
                **dict(zip(tables.cell_columns, cell, strict=True)),
                **tables.cell_row(group, success_mse),
                "leaked_rate": leaked / len(group),
                "leaked_low": low,
                "leaked_high": high,
                "seconds_mean": float(group["seconds"].astype(float).mean()),
            }
        )
    columns = tables.board_columns[: tables.board_columns.index("strongest")]
    return pd.DataFrame(rows, columns=columns)


def _image_cell(group: pd.DataFrame, success_mse: float) -> dict[str, Any]:
    """An image cell's scores (see `leaderboard`)."""
    identified_rate, _ = _complete_mean_ci95(group, "identified")
    psnr_mean, psnr_ci, n = mean_ci95(group["psnr"].to_numpy())
    ssim_mean, ssim_ci, _ = mean_ci95(group["ssim"].to_numpy())
    lpips_mean, lpips_ci = _complete_mean_ci95(group, "lpips")
    return {
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
        "diverged": int((group["status"] == "diverged").sum()),
        "errors": int((group["status"] == "error").sum()),
        "budget_share": budget_share(group),
        "converged_rate": converged_rate(group),
    }


def _text_cell(group: pd.DataFrame, success_mse: float) -> dict[str, Any]:
    """A text cell's scores: the means of the sentences' scores, the share recovered exactly,
    and the attack's first note on a rank it could not reach (``beyond ...``)."""
    notes = sorted({str(n) for n in group["note"].fillna("") if str(n).startswith("beyond")})
    return {
        "n": len(group),
        **{
            f"{c}_mean": float(group[c].astype(float).mean())
            for c in ("rouge1", "rouge2", "rougeL", "token_accuracy", "bag_precision", "bag_recall")
        },
        "exact_rate": float(group["exact"].astype(float).mean()),
        "notes": "; ".join(notes[:1]),
    }


def identified_chance(group: pd.DataFrame) -> float:
    """A cell's chance of identification: the level its identifications are tested against
    (`leakbench.outputs.leak_flags.cell_chance`: the measured rate of its standing null
    reconstructions, ``identified_null``, floored at ``1 / (pool + 1)``)."""
    return cell_chance(group)


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


def strongest_attack(
    board: pd.DataFrame,
    by: tuple[str, ...] = ("success_rate", "psnr_mean"),
    keys: list[str] = DEFENSE_COLUMNS,
) -> pd.Series:
    """True on each defense cell's (``keys``) strongest attack row (see `leaderboard`): the
    highest ``leaked_rate``, ties broken by the scores ``by``, then by the attack listed first."""
    flags = pd.Series(False, index=board.index, dtype=bool)
    if board.empty:
        return flags
    # A stable sort keeps the listed order among exact ties; NaN scores rank last.
    order = [c for c in ("leaked_rate", *by) if c in board.columns]
    ranked = board.sort_values(order, ascending=False, kind="mergesort", na_position="last")
    first = ranked.groupby(keys, sort=False).head(1).index
    flags.loc[first] = True
    return flags


@dataclasses.dataclass(frozen=True)
class Tables:
    """What one modality's tables hold (the columns of trials.csv, utility.csv and
    leaderboard.csv), and the parts of `leaderboard` that differ between modalities.

    ``setting``: what a verdict is relative to, the columns of a cell before its attack
    (`cell_columns`); ``item``: the trial column naming a seed's private example; ``marker``: a
    trials.csv column only this modality has (`modality_of`; none for the image's, the
    default); ``strongest_by``: the scores that break a tie on the share leaked
    (`strongest_attack`); ``audit_after``: the leaderboard column the epsilon audit's follow
    (`leaderboard_columns`). ``flags`` adds the trials' leak flags, ``cell_row`` is a cell's
    scores, ``utility_summary`` a defense's utility, and ``rank`` the verdicts and ranks (as
    `leakbench.outputs.verdicts.rank_defenses`).
    """

    modality: str
    trial_columns: list[str]
    utility_columns: list[str]
    board_columns: list[str]
    setting: list[str]
    item: str
    marker: str | None
    strongest_by: tuple[str, ...]
    audit_after: str
    flags: Callable[[pd.DataFrame, float, int], pd.DataFrame]
    cell_row: Callable[[pd.DataFrame, float], dict[str, Any]]
    utility_summary: Callable[[pd.DataFrame], pd.DataFrame]
    rank: Callable[..., pd.DataFrame]

    @property
    def cell_columns(self) -> list[str]:
        """The columns that name one cell: an attack against a defense in a setting."""
        return [*self.setting, "attack", "attack_params", "defense", "defense_params"]

    @property
    def defense_columns(self) -> list[str]:
        """The columns that name one defense configuration (of a setting)."""
        return [*self.setting, "defense", "defense_params"]


IMAGE = Tables(
    modality="image",
    trial_columns=TRIAL_COLUMNS,
    utility_columns=UTILITY_COLUMNS,
    board_columns=LEADERBOARD_COLUMNS,
    setting=SETTING,
    item="image_index",
    marker=None,
    strongest_by=("success_rate", "psnr_mean"),
    audit_after="delta",
    flags=with_leak_flags,
    cell_row=_image_cell,
    utility_summary=utility_summary,
    rank=rank_defenses,
)
TEXT = Tables(
    modality="text",
    trial_columns=TEXT_TRIAL_COLUMNS,
    utility_columns=TEXT_UTILITY_COLUMNS,
    board_columns=TEXT_LEADERBOARD_COLUMNS,
    setting=TEXT_SETTING,
    item="sentence_index",
    marker="rouge1",
    strongest_by=("rouge2_mean",),
    audit_after="epsilon",
    flags=lambda trials, _, __: (
        trials
    ),  # scored with its flags (`leakbench.components.text_metrics`)
    cell_row=_text_cell,
    utility_summary=_text_utility,
    rank=rank_text_defenses,
)
TABLES = {tables.modality: tables for tables in (IMAGE, TEXT)}


def modality_of(columns: Iterable[str]) -> Tables:
    """The tables that have ``columns``: those whose `Tables.marker` (or its mean, on a
    leaderboard) is among them, else the image's."""
    names = set(columns)
    marked = (t for t in TABLES.values() if t.marker and {t.marker, f"{t.marker}_mean"} & names)
    return next(marked, IMAGE)


def run_modality(run_dir: Path) -> str:
    """The modality of the run in ``run_dir``, by its trials.csv's header (`modality_of`)."""
    path = Path(run_dir) / "trials.csv"
    if not path.is_file():
        return IMAGE.modality
    with path.open(encoding="utf-8") as handle:
        return modality_of(handle.readline().strip().split(",")).modality


def leaderboard_columns(audited: bool, modality: str = "image") -> list[str]:
    """The leaderboard's columns of ``modality`` (`Tables.board_columns`), with
    `AUDIT_BOARD_COLUMNS` after its `Tables.audit_after` when the run audited its defenses (a
    run without an audit keeps its file as it was)."""
    columns = TABLES[modality].board_columns
    if not audited:
        return list(columns)
    at = columns.index(TABLES[modality].audit_after) + 1
    return [*columns[:at], *AUDIT_BOARD_COLUMNS, *columns[at:]]


def write_csv(frame: pd.DataFrame, path: str | Path, columns: list[str]) -> None:
    """Writes ``frame[columns]`` to ``path`` atomically (`atomic_file`)."""
    with atomic_file(path, "w", newline="") as handle:
        frame.reindex(columns=columns).to_csv(handle, index=False)
