"""The tables of a text run: trials.csv, utility.csv and leaderboard.csv with the text columns,
and the verdicts, by the image track's rules (`leakbench.outputs.verdicts`).

A text trial row is one private sentence under one (batch size, defense, attack): its scores
(`leakbench.components.text_metrics`: ROUGE-1/2/L F, exact recovery, token accuracy in place,
``leaked``), the bag-of-words precision and recall of the reconstruction's words against the
batch's (the same for every sentence of a batch), and the attack's ``stop_reason`` and ``note``
(e.g. "beyond rank").

The leaderboard has one row per (dataset, model, batch size, attack, defense) cell. Batch size
is part of the defense's key here: a text run attacks several, and a defense that holds at
B = 16 may leak at B = 1, so each (defense, B) gets its own verdict. The verdict is the image
track's: per sentence (a seed's private index) the union over every attack of the suite, the
count's Clopper-Pearson interval, and `leakbench.outputs.verdicts.verdict` (broken, leaks,
holds, holds (underpowered)); ``none`` is the baseline; a defense with no leaked sentence is
``inconclusive`` when no attack leaks `CONCLUSIVE_SHARE` of the sentences without a defense
(at that batch size), and ``untested`` when the run lists its own attacks. The utility is the
perplexity of the defense's trained model on held-out private sentences (lower is better);
ranked verdicts are ranked by the leaked share, then the perplexity.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pandas as pd

from leakbench.attacks.base import attacks_of
from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import exact_interval
from leakbench.defenses import DEFENSES
from leakbench.outputs.verdicts import (
    BROKEN_SHARE,
    CONCLUSIVE_SHARE,
    RANKED_VERDICTS,
    canonical_attack,
    verdict,
)

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
TEXT_DEFENSE_KEYS = ["dataset", "model", "batch_size", "defense", "defense_params"]
TEXT_CELL_COLUMNS = [*TEXT_DEFENSE_KEYS[:3], "attack", "attack_params", *TEXT_DEFENSE_KEYS[3:]]
TEXT_LEADERBOARD_COLUMNS = [
    *TEXT_CELL_COLUMNS, "n", "rouge1_mean", "rouge2_mean", "rougeL_mean", "exact_rate",
    "token_accuracy_mean", "bag_precision_mean", "bag_recall_mean", "leaked_rate", "leaked_low",
    "leaked_high", "seconds_mean", "notes", "strongest", "vouched", "suite_leaked", "suite_n",
    "suite_low", "suite_high", "perplexity", "next_token_accuracy", "epsilon", "rank", "verdict",
    "verdict_note", "protocol",
]  # fmt: skip


def label(name: str, params_json: str) -> str:
    """A text attack's or a defense's name with the parameters that differ from its defaults
    (``span test=distance``, ``prune ratio=0.9``)."""
    cls = attacks_of("text").peek(name) or DEFENSES.peek(name)
    params = json.loads(params_json)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)} if cls else {}
    changed = [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted(params.items())
        if defaults.get(k) != v
    ]
    return " ".join([name, *changed])


def _cell_row(cell: tuple[Any, ...], group: pd.DataFrame) -> dict[str, Any]:
    leaked = int(group["leaked"].astype(float).sum())
    low, high = exact_interval(leaked, len(group))
    notes = sorted({str(n) for n in group["note"].fillna("") if str(n).startswith("beyond")})
    return {
        **dict(zip(TEXT_CELL_COLUMNS, cell, strict=True)),
        "n": len(group),
        **{
            f"{c}_mean": float(group[c].astype(float).mean())
            for c in ("rouge1", "rouge2", "rougeL", "token_accuracy", "bag_precision", "bag_recall")
        },
        "exact_rate": float(group["exact"].astype(float).mean()),
        "leaked_rate": leaked / len(group),
        "leaked_low": low,
        "leaked_high": high,
        "seconds_mean": float(group["seconds"].astype(float).mean()),
        "notes": "; ".join(notes[:1]),
    }


def _union(trials: pd.DataFrame) -> pd.DataFrame:
    """Per (defense, batch size): sentences leaked by any attack, of how many, the interval."""
    frame = trials.assign(
        _sentence=trials["seed"].astype(str) + ":" + trials["sentence_index"].astype(str),
        _leaked=trials["leaked"].astype(float) == 1,
    )
    rows = []
    for keys, group in frame.groupby(TEXT_DEFENSE_KEYS, sort=False):
        per = group.groupby("_sentence", sort=False)["_leaked"].any()
        k, n = int(per.sum()), len(per)
        low, high = exact_interval(k, n)
        rows.append(
            {
                **dict(zip(TEXT_DEFENSE_KEYS, keys, strict=True)),
                "suite_leaked": k,
                "suite_n": n,
                "suite_low": low,
                "suite_high": high,
            }
        )
    return pd.DataFrame(rows)


def _strongest(board: pd.DataFrame) -> pd.Series:
    """True on each (defense, batch size)'s attack that leaked most (then the highest ROUGE-2,
    then the attack listed first)."""
    flags = pd.Series(False, index=board.index)
    for _, group in board.groupby(TEXT_DEFENSE_KEYS, sort=False):
        order = group.sort_values(["leaked_rate", "rouge2_mean"], ascending=False, kind="stable")
        flags[order.index[0]] = True
    return flags


def _vouched(board: pd.DataFrame) -> pd.Series:
    """Whether the row's attack leaked at least `BROKEN_SHARE` of the sentences without a
    defense at the same (dataset, model, batch size)."""
    none = board[board["defense"] == "none"]
    good = {
        (r.dataset, r.model, r.batch_size, canonical_attack(r.attack, r.attack_params))
        for r in none.itertuples()
        if float(r.leaked_rate) >= BROKEN_SHARE
    }
    return pd.Series(
        [
            (r.dataset, r.model, r.batch_size, canonical_attack(r.attack, r.attack_params)) in good
            for r in board.itertuples()
        ],
        index=board.index,
    )


def text_leaderboard(
    trials: pd.DataFrame, utility: pd.DataFrame | None = None, protocol: int = PROTOCOL
) -> pd.DataFrame:
    """One row per cell with the text columns, the suite union, utility, verdicts and ranks."""
    if trials.empty:
        return pd.DataFrame(columns=TEXT_LEADERBOARD_COLUMNS)
    rows = [_cell_row(c, g) for c, g in trials.groupby(TEXT_CELL_COLUMNS, sort=False)]
    board = pd.DataFrame(rows)
    board["strongest"] = _strongest(board)
    board["vouched"] = _vouched(board)
    board = board.merge(_union(trials), on=TEXT_DEFENSE_KEYS, how="left")
    if utility is not None and not utility.empty:
        means = utility.groupby(["dataset", "model", "defense", "defense_params"], sort=False).agg(
            perplexity=("perplexity", "mean"),
            next_token_accuracy=("next_token_accuracy", "mean"),
            epsilon=("epsilon", "max"),
        )
        board = board.join(means, on=["dataset", "model", "defense", "defense_params"])
    board = board.reindex(columns=TEXT_LEADERBOARD_COLUMNS)
    board["verdict"], board["verdict_note"] = _judge(board, protocol)
    board["rank"] = _ranks(board)
    board["protocol"] = protocol
    return board


def _judge(board: pd.DataFrame, protocol: int) -> tuple[list[str], list[str]]:
    verdicts, notes = pd.Series("", index=board.index), pd.Series("", index=board.index)
    for _, group in board.groupby(["dataset", "model", "batch_size"], sort=False):
        none = group[group["defense"] == "none"]
        base = float((none["suite_leaked"] / none["suite_n"]).max()) if len(none) else 0.0
        for keys, rows in group.groupby(["defense", "defense_params"], sort=False):
            head = rows[rows["strongest"].astype(bool)].iloc[0]
            k, n = int(head["suite_leaked"]), int(head["suite_n"])
            note = (
                f"{k}/{n} sentences leaked over the suite (95% CI {100 * head['suite_low']:.1f}"
                f"-{100 * head['suite_high']:.1f}%); strongest "
                f"{label(str(head['attack']), str(head['attack_params']))}"
            )
            if keys[0] == "none":
                result = "baseline"
            elif k:
                result = verdict(k, n)
            elif not len(none) or not none["vouched"].any() or base < CONCLUSIVE_SHARE:
                result = "inconclusive"
                note += (
                    f"; without a defense the attacks leak {100 * base:.0f}% "
                    f"(< {CONCLUSIVE_SHARE:.0%})"
                )
            elif protocol < PROTOCOL:
                result, note = "untested", note + "; the run lists its own attacks"
            else:
                result = verdict(0, n)
            verdicts[rows.index] = result
            notes[rows.index] = note
    return verdicts.tolist(), notes.tolist()


def _ranks(board: pd.DataFrame) -> pd.Series:
    """1, 2, ... per (dataset, model, batch size) among the ranked verdicts' heads: fewest
    sentences leaked first, then the lower perplexity; equal rows share a rank."""
    ranks = pd.Series(np.nan, index=board.index)
    heads = board[board["strongest"].astype(bool) & board["verdict"].isin(RANKED_VERDICTS)]
    for _, group in heads.groupby(["dataset", "model", "batch_size"], sort=False):
        share = group["suite_leaked"] / group["suite_n"]
        keys = pd.DataFrame({"share": share, "ppl": group["perplexity"].astype(float)})
        ordered = keys.sort_values(["share", "ppl"], kind="mergesort", na_position="last")
        last, current = None, 0
        for position, (index, values) in enumerate(ordered.iterrows(), start=1):
            pair = tuple(values)
            current = current if last is not None and pair == last else position
            last = pair
            same = (board[TEXT_DEFENSE_KEYS] == board.loc[index, TEXT_DEFENSE_KEYS]).all(axis=1)
            ranks[same] = float(current)
    return ranks


def text_headline(board: pd.DataFrame) -> str:
    """The leaderboard as the command line prints it: per (batch size, defense) its strongest
    attack's ROUGE and the verdict."""
    heads = board[board["strongest"].astype(bool)]
    lines = [
        f"{'B':>3}  {'defense':<28} {'strongest':<18} {'leaked':>9} {'ROUGE-1':>7} "
        f"{'ROUGE-2':>7} {'exact':>5} {'ppl':>7}  verdict"
    ]
    for _, r in heads.iterrows():
        defense = label(str(r["defense"]), str(r["defense_params"]))[:28]
        lines.append(  # the strongest attack's label is in the note
            f"{int(r['batch_size']):>3}  {defense:<28} {str(r['attack'])[:18]:<18} "
            f"{int(r['suite_leaked']):>4}/{int(r['suite_n']):<4} {r['rouge1_mean']:>7.2f} "
            f"{r['rouge2_mean']:>7.2f} {r['exact_rate']:>5.2f} {float(r['perplexity']):>7.1f}  "
            f"{r['verdict']}"
        )
    return "\n".join(lines)
