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
    with its 95% interval. A label longer than its column wraps onto the lines below at its
    spaces (`wrap_cell`): no name is ever cut. With several (dataset, model) pairs each
    pair's rows follow a line that names it. Below the table: one line per verdict that
    occurs, and the rule. A text run's board is printed as `text_headline`."""
    if modality_of(board.columns) is TEXT:
        return text_headline(board)
    header, body, settings = headline_rows(board)
    rows, settings = [header, *body], ["", *settings]
    lines = []
    sizes = _label_widths(rows, header)
    for k, r in enumerate(rows):
        if settings[k] and settings[k] != settings[k - 1]:
            lines.append(settings[k])
        wrapped = [wrap_cell(c, w) for c, w in zip(r, sizes, strict=True)]
        for at in range(max(len(cell) for cell in wrapped)):
            parts = [
                (cell[at] if at < len(cell) else "").rjust(w)
                if h in NUMERIC_HEADLINE
                else (cell[at] if at < len(cell) else "").ljust(w)
                for cell, w, h in zip(wrapped, sizes, header, strict=True)
            ]
            lines.append("  ".join(parts).rstrip())
    for line in verdict_summary(board):
        lines.extend(textwrap.wrap(line, PRINT_WIDTH, subsequent_indent="  "))
    lines.append(
        "leaked: recovered, identified or recognisable under any attack; recov: recovered exactly"
    )
    lines.extend(textwrap.wrap(VERDICT_RULE + "; every row: leaderboard.csv", PRINT_WIDTH))
    return "\n".join(lines)


# The printed leaderboard's columns (`headline_rows`).
HEADLINE = ["verdict", "rank", "defense", "strongest", "leaked (95% CI)", "recov", "accuracy"]
# Its columns of numbers (right-aligned).
NUMERIC_HEADLINE = {"rank", "leaked (95% CI)", "recov", "accuracy"}


def headline_rows(board: Any) -> tuple[list[str], list[list[str]], list[str]]:
    """The printed leaderboard's header (`HEADLINE`), its rows (one per defense configuration:
    its strongest attack's row, fewest images reconstructed first, unranked last; labels in
    full) and each row's (dataset, model) pair as "dataset/model" (empty when the board holds
    one pair): what `headline_table` prints and the report shows first."""
    heads = board[board["strongest"].astype(bool)]
    heads = heads.assign(_order=heads["rank"].fillna(float("inf"))).sort_values(
        ["dataset", "model", "_order"], kind="mergesort"
    )
    several = heads[["dataset", "model"]].drop_duplicates().shape[0] > 1
    rows, settings = [], []
    for _, row in heads.iterrows():
        rows.append([
            verdict_cell(str(row.get("verdict", "") or "")),
            "-" if row["rank"] != row["rank"] else str(int(row["rank"])),
            defense_label(row["defense"], row["defense_params"]),
            attack_label(row["attack"], row["attack_params"]),
            _leaked(row),
            f"{100 * row['success_rate']:.0f}%",
            _accuracy(row),
        ])  # fmt: skip
        settings.append(f"{row['dataset']}/{row['model']}" if several else "")
    return list(HEADLINE), rows, settings


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


def wrap_cell(text: str, width: int) -> list[str]:
    """``text`` as the lines of a table cell ``width`` characters wide, broken at spaces (in a
    text without spaces, after a "/"; a word longer than the cell keeps its line whole):
    never cut."""
    if len(text) <= width:
        return [text]
    lines = textwrap.wrap(
        " ".join(_words(text)), width, break_long_words=False, break_on_hyphens=False
    )
    return [line.replace("/ ", "/") for line in lines] or [""]


def _words(text: str) -> list[str]:
    """The words `wrap_cell` breaks ``text`` between."""
    return text.replace("/", "/ ").split() if " " not in text else text.split()


def _accuracy(row: Any) -> str:
    """A headline row's mean test accuracy with its 95% interval ("-" without training)."""
    if row["test_accuracy"] != row["test_accuracy"]:  # NaN: no training
        return "-"
    interval = row.get("test_accuracy_ci95", float("nan"))
    text = f"{100 * row['test_accuracy']:.1f}"
    return text if interval != interval else f"{text}+-{100 * interval:.1f}"


def verdict_cell(verdict: str) -> str:
    """A verdict as the printed table shows it: ``inconclusive (attack did not converge)`` as
    ``unconverged`` (the line below the table spells it out), so that its length does not cut
    every other row's labels; any other verdict as it is."""
    return "unconverged" if verdict == UNCONVERGED else verdict


def _label_widths(rows: list[list[str]], header: list[str]) -> list[int]:
    """Each column's width: its longest cell, except the label columns (defense, strongest
    attack) where a line would pass `PRINT_WIDTH`; those share what the other
    columns leave (each at least its longest word and its header), the longest first
    narrowed."""
    sizes = [max(len(r[i]) for r in rows) for i in range(len(header))]
    labels = [header.index("defense"), header.index("strongest")]
    over = sum(sizes) + 2 * (len(sizes) - 1) - PRINT_WIDTH
    floors = {
        i: max([len(header[i])] + [len(w) for r in rows[1:] for w in _words(r[i])]) for i in labels
    }
    while over > 0:
        widest = max(labels, key=lambda i: sizes[i] - floors[i])
        if sizes[widest] <= floors[widest]:
            break  # the words alone pass the line: it stays long
        sizes[widest] -= 1
        over -= 1
    return sizes


def verdict_summary(board: Any) -> list[str]:
    """One line per verdict that occurs among the defense configurations, naming them
    (`leakbench.outputs.paper_tables.verdict_lines`)."""
    return [f"{name}: " + ", ".join(texts) for name, texts in verdict_lines(board)]
