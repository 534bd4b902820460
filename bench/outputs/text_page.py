"""The HTML report of a text run: its config, the leaderboard (each defense and batch size with
its strongest attack, the scores, perplexity and the verdict) and the sentences side by side
(`leakbench.outputs.text_report.text_examples_html`: the private sentence beside each attack's
reconstruction, the tokens in place marked). Self-contained: nothing is fetched when it opens.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from leakbench.outputs import epsilon_figure
from leakbench.outputs.plotting import FigureSkipped, paper_style
from leakbench.outputs.tables import atomic_file, write_text
from leakbench.outputs.text_report import text_examples_html
from leakbench.outputs.text_tables import label

# The leaderboard's columns on the page, with their headings.
PAGE_COLUMNS = {
    "batch_size": "B",
    "defense": "defense",
    "attack": "strongest attack",
    "suite_leaked": "leaked",
    "suite_n": "of",
    "rouge1_mean": "ROUGE-1",
    "rouge2_mean": "ROUGE-2",
    "rougeL_mean": "ROUGE-L",
    "exact_rate": "exact",
    "token_accuracy_mean": "token acc.",
    "bag_recall_mean": "bag recall",
    "perplexity": "perplexity",
    "rank": "rank",
    "verdict": "verdict",
    "verdict_note": "note",
}
# Sentences shown per (defense, batch size, attack): the first batch of the first seed, at most.
EXAMPLES = 4

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.4; }
table { border-collapse: collapse; font-size: 0.8em; }
th, td { padding: 2px 6px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
mark { background: #c8f0c8; }
"""


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.3g}"
    return html.escape(str(value))


def leaderboard_html(board: pd.DataFrame) -> str:
    """The strongest attack's row of each (defense, batch size) as an HTML table."""
    heads = board[board["strongest"].astype(bool)].copy()
    heads["defense"] = [
        label(str(d), str(p))
        for d, p in zip(heads["defense"], heads["defense_params"], strict=True)
    ]
    heads["attack"] = [
        label(str(a), str(p)) for a, p in zip(heads["attack"], heads["attack_params"], strict=True)
    ]
    head = "".join(f"<th>{html.escape(t)}</th>" for t in PAGE_COLUMNS.values())
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(r[c])}</td>" for c in PAGE_COLUMNS) + "</tr>"
        for _, r in heads.iterrows()
    )
    return f'<table class="leaderboard"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def example_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The sentences the page shows: of each (batch size, defense, attack), the first batch of
    the first seed (at most `EXAMPLES` sentences), labelled with the batch size."""
    if trials.empty:
        return trials
    first = trials[(trials["seed"] == trials["seed"].iloc[0]) & (trials["batch_index"] == 0)]
    first = first[first["position"] < EXAMPLES].copy()
    first["defense"] = [
        f"{label(str(d), str(p))} (B = {b})"
        for d, p, b in zip(
            first["defense"], first["defense_params"], first["batch_size"], strict=True
        )
    ]
    first["attack"] = [
        label(str(a), str(p)) for a, p in zip(first["attack"], first["attack_params"], strict=True)
    ]
    return first


# The epsilon audit's columns on the page (``epsilon_audit.csv``), with their headings.
AUDIT_PAGE_COLUMNS = {
    "batch_size": "B",
    "defense": "defense",
    "epsilon_update": "RDP",
    "epsilon_exact": "PLD (exact)",
    "epsilon_audit": "distribution-free",
    "epsilon_audit_gdp": "Gaussian-DP",
    "epsilon_audit_confidence": "confidence",
    "epsilon_audit_cap": "most shown",
    "rounds": "rounds",
    "canaries": "canaries",
    "batches": "batches",
    "canary_mu": "canary mu",
    "bound_of": "about",
    "audit": "audit",
}


def audit_html(out: Path) -> list[str]:
    """The run's epsilon audit (``out/epsilon_audit.csv``, `leakbench.run.text_audit`) as a
    section of the page; nothing when the run has none."""
    path = out / "epsilon_audit.csv"
    if not path.is_file():
        return []
    audit = pd.read_csv(path)
    audit["defense"] = [
        label(str(d), str(p))
        for d, p in zip(audit["defense"], audit["defense_params"], strict=True)
    ]
    head = "".join(f"<th>{html.escape(t)}</th>" for t in AUDIT_PAGE_COLUMNS.values())
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(r[c])}</td>" for c in AUDIT_PAGE_COLUMNS) + "</tr>"
        for _, r in audit.iterrows()
    )
    return [
        "<h2>Measured privacy</h2>",
        "<p>Per batch size and defense, lower bounds on the epsilon of one update measured with "
        "Dirac gradient canaries in the token embedding (distribution-free, and Gaussian-DP "
        "where the score is Gaussian), beside the accountants' epsilons of that update (RDP, "
        "and the exact PLD value that decides the audit). A bound above the exact value fails "
        "the audit; for a defense without a guarantee the bound is the canary's.</p>",
        f'<table class="audit"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>',
    ]


def write_text_figures(
    run_dir: Path, out: Path | None = None, formats: tuple[str, ...] = ("pdf", "png")
) -> list[Path]:
    """``leakbench figures`` of a text run: the epsilon audit's figure
    (`leakbench.outputs.epsilon_figure`) into ``out`` (default ``run_dir/figures``) where the
    run has an audit, one per batch size when it audited several (``epsilon_audit_b4``);
    nothing otherwise. Returns the files written."""
    path = run_dir / epsilon_figure.FILE
    if not path.is_file():
        return []
    audit = pd.read_csv(path)
    folder = run_dir / "figures" if out is None else out
    folder.mkdir(parents=True, exist_ok=True)
    sizes = list(dict.fromkeys(audit["batch_size"]))
    written = []
    with paper_style():
        for size in sizes:
            name = "epsilon_audit" if len(sizes) == 1 else f"epsilon_audit_b{size}"
            rows = audit[audit["batch_size"] == size].reset_index(drop=True)
            try:
                fig = epsilon_figure.epsilon_audit(rows)
            except FigureSkipped:
                continue
            for fmt in formats:
                target = folder / f"{name}.{fmt}"
                metadata = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
                with atomic_file(target, "wb") as handle:
                    fig.savefig(handle, format=fmt, metadata=metadata)
                written.append(target)
    return written


def is_text_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a text run's tables (its trials.csv has a ``rouge1`` column)."""
    path = run_dir / "trials.csv"
    if not path.is_file():
        return False
    with path.open(encoding="utf-8") as handle:
        return "rouge1" in handle.readline().strip().split(",")


def write_text_report_of(run_dir: Path, path: Path | None = None) -> Path:
    """`write_text_report` from a text run directory's CSVs (``leakbench report``)."""
    trials = pd.read_csv(run_dir / "trials.csv", keep_default_na=False, na_values=[""])
    board = pd.read_csv(run_dir / "leaderboard.csv")
    return write_text_report(run_dir, trials, board, path)


def write_text_report(
    out: Path, trials: pd.DataFrame, board: pd.DataFrame, path: Path | None = None
) -> Path:
    """Writes ``path`` (default ``out/report.html``) for the text run in ``out``; returns it."""
    config = (out / "config.toml").read_text(encoding="utf-8")
    name = str(trials["run"].iloc[0]) if len(trials) else out.name
    page = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>leakbench text run {html.escape(name)}</title><style>{_STYLE}</style></head>",
        f"<body><h1>Text run {html.escape(name)}</h1>",
        "<h2>Leaderboard</h2>",
        "<p>Per batch size and defense, its strongest attack: sentences leaked over the suite "
        "(exact recovery or ROUGE-2 at or above the leak threshold, by any attack), mean "
        "ROUGE F, exact recovery and token accuracy of that attack, and the defense's "
        "perplexity on held-out private sentences (lower is better). leaderboard.csv holds "
        "every attack.</p>",
        leaderboard_html(board),
        *audit_html(out),
        text_examples_html(example_rows(trials)),
        f"<h2>Config</h2><pre>{html.escape(config)}</pre>",
        "</body></html>",
    ]
    path = out / "report.html" if path is None else path
    write_text(path, "\n".join(page) + "\n")
    return path
