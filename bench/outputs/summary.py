"""The leaderboard as the command line prints it: one line per defense configuration under
its strongest attack, and one line per verdict naming its configurations (a text run's: one
line per batch size and defense). `leakbench run` and `rescore` print it; the README's
generated passages quote it."""

from __future__ import annotations

import textwrap
from typing import Any

from leakbench.outputs.naming import attack_label, defense_label
from leakbench.outputs.paper_tables import verdict_lines
from leakbench.outputs.tables import TEXT, VERDICT_RULE, modality_of
from leakbench.outputs.verdicts import UNCONVERGED

# The printed leaderboard: one line per defense configuration, its strongest attack's row,
# within this many columns (the CSV keeps every row and column).
PRINT_WIDTH = 100


def headline_table(board: Any) -> str:
    """The leaderboard as printed: per defense configuration (fewest images reconstructed
    first, unranked last) its verdict, rank, its strongest attack, the images that attack
    leaked (recovered, identified or recognisable: `leakbench.components.leakage`) with the
    exact 95% interval of that share, the share recovered exactly and the mean test accuracy
    with its 95% interval; labels longer than their column lose their middle to a "~" (`cut`;
    two different labels never read the same: `distinct_cuts`). With several (dataset, model)
    pairs each line names its pair. Below the table: one line per verdict that occurs, and the
    rule. A text run's board is printed as `text_headline`."""
    if modality_of(board.columns) is TEXT:
        return text_headline(board)
    heads = board[board["strongest"].astype(bool)]
    heads = heads.assign(_order=heads["rank"].fillna(float("inf"))).sort_values(
        ["dataset", "model", "_order"], kind="mergesort"
    )
    several = heads[["dataset", "model"]].drop_duplicates().shape[0] > 1
    # The label columns share what the others (at most 55 columns with the gaps) leave.
    widths = {"setting": 0, "defense": 24, "attack": 20}
    if several:
        widths = {"setting": 12, "defense": 17, "attack": 13}

    def accuracy(row: Any) -> str:
        if row["test_accuracy"] != row["test_accuracy"]:  # NaN: no training
            return "-"
        interval = row.get("test_accuracy_ci95", float("nan"))
        text = f"{100 * row['test_accuracy']:.1f}"
        return text if interval != interval else f"{text}+-{100 * interval:.1f}"

    lines = []
    header = ["verdict", "rank", "defense", "strongest", "leaked (95% CI)", "recov",
              "accuracy"]  # fmt: skip
    if several:
        header.insert(0, "dataset/model")
    rows = [header]
    full: list[dict[int, str]] = []  # each row's uncut labels, by column
    for _, row in heads.iterrows():
        cells = [
            verdict_cell(str(row.get("verdict", "") or "")),
            "-" if row["rank"] != row["rank"] else str(int(row["rank"])),
            cut(defense_label(row["defense"], row["defense_params"]), widths["defense"]),
            cut(attack_label(row["attack"], row["attack_params"]), widths["attack"]),
            _leaked(row),
            f"{100 * row['success_rate']:.0f}%",
            accuracy(row),
        ]
        labels = {
            2: defense_label(row["defense"], row["defense_params"]),
            3: attack_label(row["attack"], row["attack_params"]),
        }
        if several:
            setting = f"{row['dataset']}/{row['model']}"  # its start, the dataset, stays
            cells.insert(0, cut(setting, widths["setting"], keep="start"))
            labels = {i + 1: text for i, text in labels.items()}
        rows.append(cells)
        full.append(labels)
    rows = _fit_labels(rows, header, cut)
    rows = distinct_cuts(rows, header, full)
    sizes = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {"rank", "recov", "accuracy", "leaked (95% CI)"}
    for r in rows:
        parts = [
            c.rjust(w) if h in numeric else c.ljust(w)
            for c, w, h in zip(r, sizes, header, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    for line in verdict_summary(board):
        lines.extend(textwrap.wrap(line, PRINT_WIDTH, subsequent_indent="  "))
    lines.append(
        "leaked: recovered, identified or recognisable under any attack; recov: recovered exactly"
    )
    lines.extend(textwrap.wrap(VERDICT_RULE + "; every row: leaderboard.csv", PRINT_WIDTH))
    return "\n".join(lines)


def text_headline(board: Any) -> str:
    """A text run's leaderboard as printed: per (batch size, defense) its strongest attack's
    ROUGE, exact recovery and perplexity, and the verdict."""
    heads = board[board["strongest"].astype(bool)]
    lines = [
        f"{'B':>3}  {'defense':<28} {'strongest':<18} {'leaked':>9} {'ROUGE-1':>7} "
        f"{'ROUGE-2':>7} {'exact':>5} {'ppl':>7}  verdict"
    ]
    for _, r in heads.iterrows():
        defense = defense_label(str(r["defense"]), str(r["defense_params"]), short=True)[:28]
        lines.append(  # the strongest attack's label is in the note
            f"{int(r['batch_size']):>3}  {defense:<28} {str(r['attack'])[:18]:<18} "
            f"{int(r['suite_leaked']):>4}/{int(r['suite_n']):<4} {r['rouge1_mean']:>7.2f} "
            f"{r['rouge2_mean']:>7.2f} {r['exact_rate']:>5.2f} {float(r['perplexity']):>7.1f}  "
            f"{r['verdict']}"
        )
    return "\n".join(lines)


def _leaked(row: Any) -> str:
    """A headline row's images leaked, with the exact 95% interval."""
    # The defense's images leaked over the whole suite (the per-image union); a board
    # written before the union existed shows its strongest attack's share.
    if row.get("suite_n", float("nan")) == row.get("suite_n", float("nan")):
        k, n = int(row["suite_leaked"]), int(row["suite_n"])
        low, high = row["suite_low"], row["suite_high"]
    else:
        share = row.get("leaked_rate", float("nan"))
        if share != share:
            return "-"
        k, n = round(share * row["n"]), int(row["n"])
        low, high = row.get("leaked_low", float("nan")), row.get("leaked_high", float("nan"))
    return f"{k}/{n} ({100 * low:.1f}-{100 * high:.1f}%)"


def cut(text: str, width: int, keep: str = "both") -> str:
    """``text`` at most ``width`` characters: its middle replaced by "~", so that both its start
    (the name) and its end (usually the values that tell settings apart) stay; with ``keep =
    "start"`` its end is replaced instead."""
    if len(text) <= width:
        return text
    if width < 4 or keep == "start":
        return text[: width - 1] + "~" if width >= 2 else text[:width]
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "~" + text[len(text) - tail :]


def distinct_cuts(
    rows: list[list[str]], header: list[str], full: list[dict[int, str]]
) -> list[list[str]]:
    """``rows`` where no cut label reads like another row's different label: such labels are
    cut again keeping their end ("~" and the last characters, where the values differ), and
    given in full where that is not enough either (a line may then pass `PRINT_WIDTH`)."""
    out = [list(r) for r in rows]
    for column in {c for labels in full for c in labels}:
        for shorten in (lambda text, width: "~" + text[len(text) - width + 1 :], None):
            shown: dict[str, set[str]] = {}
            for row, labels in zip(out[1:], full, strict=True):
                shown.setdefault(row[column], set()).add(labels[column])
            clash = [
                (row, labels[column])
                for row, labels in zip(out[1:], full, strict=True)
                if len(shown[row[column]]) > 1
            ]
            for row, text in clash:
                width = len(row[column])
                row[column] = text if shorten is None else shorten(text, width)
    return out


def verdict_cell(verdict: str) -> str:
    """A verdict as the printed table shows it: ``inconclusive (attack did not converge)`` as
    ``unconverged`` (the line below the table spells it out), so that its length does not cut
    every other row's labels; any other verdict as it is."""
    return "unconverged" if verdict == UNCONVERGED else verdict


def _fit_labels(rows: list[list[str]], header: list[str], cut: Any) -> list[list[str]]:
    """``rows`` with the defense and attack labels cut further where a long verdict ("holds
    (underpowered)") or interval would push a line past `PRINT_WIDTH`."""
    sizes = [max(len(r[i]) for r in rows) for i in range(len(header))]
    over = sum(sizes) + 2 * (len(sizes) - 1) - PRINT_WIDTH
    if over <= 0:
        return rows
    at = {name: header.index(name) for name in ("defense", "strongest")}
    attack_cut = (over + 1) // 2
    limits = {
        at["strongest"]: sizes[at["strongest"]] - attack_cut,
        at["defense"]: sizes[at["defense"]] - (over - attack_cut),
    }
    return [rows[0]] + [
        [cut(c, limits[i]) if i in limits else c for i, c in enumerate(r)] for r in rows[1:]
    ]


def verdict_summary(board: Any) -> list[str]:
    """One line per verdict that occurs among the defense configurations, naming them
    (`leakbench.outputs.paper_tables.verdict_lines`)."""
    return [f"{name}: " + ", ".join(texts) for name, texts in verdict_lines(board)]
