"""The leaderboard as a table for a paper or a web page: LaTeX (booktabs), markdown or CSV.

One row per ``leaderboard.csv`` row, in its order. Scores are rounded and shown with their 95%
CI half-width (``27.1 ± 3.2``); in each column the best value is bold: the lowest PSNR, SSIM,
label accuracy, success rate, accuracy drop and epsilon (most private, cheapest) and the highest
LPIPS and test accuracy. Ties are all bold. ``csv`` is the leaderboard file itself, unrounded.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from leakbench.core.errors import DataError
from leakbench.outputs.guarantees import LABEL_NOTE
from leakbench.outputs.naming import attack_label, defense_label
from leakbench.outputs.tables import ADDED_COLUMNS, LEADERBOARD_COLUMNS, VERDICTS

FORMATS = ("latex", "markdown", "csv")


@dataclasses.dataclass(frozen=True)
class Column:
    """A shown column: its header, the leaderboard column it ranks by, which end is best, and
    how a row's value is written (``None`` when it has no value)."""

    header: str
    key: str
    best: str  # "min", "max" or "" (not ranked)
    text: Callable[[pd.Series], str | None]

    @property
    def numeric(self) -> bool:
        """Whether the shown cells start with a number (the report sorts them as numbers)."""
        return bool(self.best) or self.key in ("n", "rank")


def _number(digits: int, key: str, ci: str | None = None) -> Callable[[pd.Series], str | None]:
    def text(row: pd.Series) -> str | None:
        value = row[key]
        if pd.isna(value):
            return None
        shown = f"{float(value):.{digits}f}"
        if ci is not None and pd.notna(row[ci]):
            shown += f" ± {float(row[ci]):.{digits}f}"
        return shown

    return text


def _share(row: pd.Series) -> str | None:
    """The share of images leaked with its exact interval, e.g. ``0.50 (0.16-0.84)``."""
    if pd.isna(row.get("leaked_rate")):
        return None
    return f"{row['leaked_rate']:.2f} ({row['leaked_low']:.2f}-{row['leaked_high']:.2f})"


def _identified(row: pd.Series) -> str | None:
    """The share identified among the distractors, with the share chance gives."""
    if pd.isna(row.get("identified_rate")):
        return None
    return f"{row['identified_rate']:.2f} ({row['identified_chance']:.3f})"


def _rank(row: pd.Series) -> str | None:
    return None if pd.isna(row["rank"]) else str(int(row["rank"]))


COLUMNS = [
    Column("Defense", "defense", "", lambda r: defense_label(r["defense"], r["defense_params"])),
    Column("Attack", "attack", "", lambda r: attack_label(r["attack"], r["attack_params"])),
    Column("n", "n", "", lambda r: str(int(r["n"]))),
    Column("PSNR (dB)", "psnr_mean", "min", _number(1, "psnr_mean", "psnr_ci95")),
    Column("SSIM", "ssim_mean", "min", _number(3, "ssim_mean", "ssim_ci95")),
    Column("LPIPS", "lpips_mean", "max", _number(3, "lpips_mean", "lpips_ci95")),
    Column("Label acc.", "label_acc", "min", _number(2, "label_acc")),
    Column("Success", "success_rate", "min", _number(2, "success_rate")),
    Column("Leaked (95% CI)", "leaked_rate", "min", _share),
    Column("Identified (chance)", "identified_rate", "min", _identified),
    Column("Recognisable", "recognisable_rate", "min", _number(2, "recognisable_rate")),
    Column("Test acc.", "test_accuracy", "max", _number(3, "test_accuracy", "test_accuracy_ci95")),
    Column("Acc. drop", "accuracy_drop", "min", _number(3, "accuracy_drop")),
    Column("ε", "epsilon", "min", _number(2, "epsilon")),
    Column("Strongest", "strongest", "", lambda r: "yes" if bool(r["strongest"]) else ""),
    Column("Rank", "rank", "", _rank),
    Column("Pareto", "pareto", "", lambda r: "yes" if bool(r["pareto"]) else ""),
    Column("Verdict", "verdict", "", lambda r: "" if pd.isna(r["verdict"]) else str(r["verdict"])),
]


def load_leaderboard(run_dir: str | Path) -> pd.DataFrame:
    """A run directory's ``leaderboard.csv``; a missing or foreign file is a `DataError`."""
    path = Path(run_dir) / "leaderboard.csv"
    if not path.is_file():
        raise DataError(f"{run_dir} holds no leaderboard.csv; give the --out of `leakbench run`")
    try:
        board = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{path} cannot be read as a CSV ({err})") from None
    missing = [c for c in LEADERBOARD_COLUMNS if c not in board.columns and c not in ADDED_COLUMNS]
    if missing:
        raise DataError(
            f"{path} lacks the columns {', '.join(missing)}; rerun `leakbench run` with the same "
            "config and --out to rewrite it with this version"
        )
    return board.reindex(columns=[*board.columns, *(c for c in ADDED_COLUMNS if c not in board)])


def best_rows(board: pd.DataFrame, column: Column) -> set[int]:
    """Positions of the rows holding the best value of ``column`` (none if it is not ranked)."""
    if not column.best or board.empty:
        return set()
    values = pd.to_numeric(board[column.key], errors="coerce").reset_index(drop=True)
    if values.notna().sum() == 0:
        return set()
    target = values.min() if column.best == "min" else values.max()
    return {i for i, v in enumerate(values) if v == target}


def _cells(board: pd.DataFrame) -> list[list[tuple[str, bool]]]:
    """Each row's cell texts with a flag for bold, '–' where there is no value."""
    bold = [best_rows(board, c) for c in COLUMNS]
    rows = []
    for i, (_, row) in enumerate(board.reset_index(drop=True).iterrows()):
        cells = []
        for column, best in zip(COLUMNS, bold, strict=True):
            text = column.text(row)
            cells.append(("–", False) if text is None else (text, i in best))
        rows.append(cells)
    return rows


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped; ± and ε become math symbols."""
    out = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("ε", r"$\varepsilon$").replace("–", "--")


def to_latex(board: pd.DataFrame) -> str:
    """A booktabs ``tabular`` (needs ``\\usepackage{booktabs}``), one row per leaderboard row."""
    header = " & ".join(latex_escape(c.header) for c in COLUMNS)
    lines = [
        "\\begin{tabular}{" + "l" * 2 + "r" * (len(COLUMNS) - 2) + "}",
        "\\toprule",
        header + " \\\\",
        "\\midrule",
    ]
    for cells in _cells(board):
        texts = [f"\\textbf{{{latex_escape(t)}}}" if bold else latex_escape(t) for t, bold in cells]
        lines.append(" & ".join(texts) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_markdown(board: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table, one row per leaderboard row."""

    def escape(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "| " + " | ".join(c.header for c in COLUMNS) + " |",
        "| " + " | ".join("---" if not c.best and c.key != "n" else "---:" for c in COLUMNS) + " |",
    ]
    for cells in _cells(board):
        texts = [f"**{escape(t)}**" if bold else escape(t) for t, bold in cells]
        lines.append("| " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


HTML_TABLE_ID = "leaderboard"


def to_html(board: pd.DataFrame) -> str:
    """An HTML ``<table>`` of the same cells (for the report), with the id `HTML_TABLE_ID`; the
    headers of numeric columns carry ``data-type="number"``."""
    head = "".join(
        f'<th data-type="number">{html.escape(c.header)}</th>'
        if c.numeric
        else f"<th>{html.escape(c.header)}</th>"
        for c in COLUMNS
    )
    body = []
    for cells in _cells(board):
        tds = "".join(
            f"<td><b>{html.escape(t)}</b></td>" if bold else f"<td>{html.escape(t)}</td>"
            for t, bold in cells
        )
        body.append(f"<tr>{tds}</tr>")
    return (
        f'<table class="leaderboard" id="{HTML_TABLE_ID}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def format_table(board: pd.DataFrame, fmt: str) -> str:
    """The leaderboard in ``fmt`` (one of `FORMATS`)."""
    if fmt == "latex":
        return to_latex(board)
    if fmt == "markdown":
        return to_markdown(board)
    if fmt == "csv":
        return board.reindex(columns=LEADERBOARD_COLUMNS).to_csv(index=False)
    raise ValueError(f"unknown table format {fmt!r}; allowed: {', '.join(FORMATS)}")


def _leaked_text(row: pd.Series) -> str:
    """ "k/n leaked" over the suite (the per-image union), or, on a board without it, by the
    strongest attack."""
    if pd.notna(row.get("suite_n", float("nan"))):
        return f"{int(row['suite_leaked'])}/{int(row['suite_n'])} leaked"
    share = row.get("leaked_rate", float("nan"))
    if pd.isna(share):
        return "share leaked unknown"
    return f"{round(share * row['n'])}/{int(row['n'])} leaked"


def _reason(note: str) -> str:
    """A verdict note as the verdicts in words give it: without its count (the first part) and
    without the label line (`leakbench.outputs.guarantees`: it is in the leaderboard's columns
    and note), so that a list of reasons stays a list of reasons; a DP ceiling stays."""
    parts = note.split("; ")
    parts = parts[1:] if len(parts) > 1 else parts
    return "; ".join(p for p in parts if not p.startswith(LABEL_NOTE))


def verdict_lines(board: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """Per verdict that occurs (in `leakbench.outputs.tables.VERDICTS` order), the defense
    configurations that got it, each as a short text: the attack that broke a ``broken`` one;
    the images leaked and the accuracy cost of a ``leaks`` or ``holds`` one; the reason of an
    ``untested`` or ``inconclusive`` one."""
    heads = board[board["strongest"].astype(bool)]
    out = []
    for name in VERDICTS:
        rows = heads[heads["verdict"] == name]
        if rows.empty:
            continue
        texts = []
        for _, row in rows.iterrows():
            label = defense_label(row["defense"], row["defense_params"])
            leaked = _leaked_text(row)
            if name == "broken":
                label += f" (by {attack_label(row['attack'], row['attack_params'])}, {leaked})"
            elif name in ("leaks", "holds", "baseline"):
                cost = row.get("accuracy_drop", float("nan"))
                label += f" ({leaked}" + (
                    f", accuracy cost {100 * cost:+.1f} points)" if pd.notna(cost) else ")"
                )
            else:
                note = _reason(str(row.get("verdict_note", "") or ""))
                label += f" ({note})" if note else ""
            texts.append(label)
        out.append((name, texts))
    return out
