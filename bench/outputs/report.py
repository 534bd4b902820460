"""A one-page, self-contained HTML report of a run directory, of either modality.

An image run's page holds the run's config, its leaderboard (the table of
`leakbench.outputs.paper_tables`, best values in bold), the ranking rule, every figure of
`leakbench.outputs.figures` embedded as a PNG data URI, and two environments: the one the run
was made with (``environment.json``, written by ``leakbench run``) and the one that drew the
report. Nothing is fetched when the page opens.

A few lines of inline script make the leaderboard sortable: a click on a header sorts the rows
by that column (numbers by the number a cell starts with, text alphabetically, cells without a
value last), a second click reverses the order. Without scripts the table stays in plan order.

A text run's page holds its leaderboard (each defense and batch size with its strongest attack,
the scores, perplexity and the verdict), its epsilon audit if it has one, the sentences side by
side (`sentences_html`: the private sentence beside each attack's reconstruction, the tokens in
place marked) and its config.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import (
    BOUND_SHARE,
    DISTRACTORS,
    RECOGNISABLE_LPIPS,
    RECOGNISABLE_PSNR,
)
from leakbench.components.text_metrics import LEAK_RULE
from leakbench.core.environment import ENVIRONMENT_FILE, describe_environment
from leakbench.core.errors import DataError
from leakbench.core.files import write_text
from leakbench.outputs.epsilon_figure import FILE, epsilon_audit
from leakbench.outputs.figures import FIGURES, Run, load_run
from leakbench.outputs.naming import attack_label, defense_label
from leakbench.outputs.paper_tables import HTML_TABLE_ID, to_html, verdict_lines
from leakbench.outputs.plotting import FigureSkipped, paper_style
from leakbench.outputs.summary import NUMERIC_HEADLINE, headline_rows
from leakbench.outputs.tables import (
    BROKEN_SHARE,
    CONCLUSIVE_SHARE,
    MIN_BROKEN_IMAGES,
    MIN_HOLDS_SEEDS,
    modality_of,
    run_modality,
)

CAPTIONS = {
    "privacy_utility": "Test accuracy of the models trained under each defense (mean and 95% CI "
    "over the training seeds) against the share of its images leaked under any attack of the "
    "suite (exact 95% CI); one line per defense family, the Pareto front circled.",
    "reconstructions": "Private images (top row) and, per defense configuration, the "
    "reconstructions of the attack that leaked most images, with its verdict; each image with "
    "its PSNR and flags (R recovered exactly, I identified among the distractors, V "
    "recognisable, M leaked by another reconstruction of its batch), red and framed when it "
    "leaked.",
    "convergence": "Gradient-matching loss against iteration (median over trials), per attack "
    "and defense configuration.",
    "leakage": "Leakage against defense strength: PSNR, SSIM, label accuracy and (when scored) "
    "LPIPS per attack (mean, 95% CI); dotted: the strongest attack without a defense.",
}

RANKING_RULE = (
    "Each image counts as <i>leaked</i> when a reconstruction of it is recovered exactly (MSE "
    "at most the run's <code>success_mse</code>), <i>identified</i> (nearer its own original "
    f"than each of {DISTRACTORS} distractor images of the dataset's other split, under LPIPS, "
    "more often than a standing null reconstruction is) or <i>recognisable</i> (PSNR at least "
    f"{RECOGNISABLE_PSNR:g} dB or LPIPS at most {RECOGNISABLE_LPIPS:g} by protocol 1; by "
    "protocol 2 nearer its original, on either measure, than a guess from the label alone "
    f"brings all but {BOUND_SHARE:.1%} of the dataset's public images, and than the class mean "
    "of its own "
    "recovered label). Every defense meets "
    f"the standard attack suite (protocol {PROTOCOL}: every attack family and the defense's "
    "adaptive attacks), and is judged by the images leaked under any of them, with the exact "
    "95% interval, never by a mean over images. <i>Verdict</i>: <code>broken</code> at "
    f"{BROKEN_SHARE:.0%} or more (and at least {MIN_BROKEN_IMAGES} images), "
    "<code>leaks</code> above 0, <code>holds</code> when no image leaked, the interval's upper "
    f"end is below {BROKEN_SHARE:.0%} (else <i>holds (underpowered)</i>), the images come from "
    f"at least {MIN_HOLDS_SEEDS} model seeds under protocol 2 (else <i>holds (one model "
    "seed)</i>) and every image was "
    "attacked by a converged attack that breaks <code>none</code>; <code>untested</code> when "
    "an attack of the suite did not run, <code>inconclusive</code> when no attack leaks at "
    f"least {CONCLUSIVE_SHARE:.0%} of the images without a defense or an attack did not "
    "converge. <code>none</code> is the <i>baseline</i>. Defenses with one of the first three "
    "verdicts that cost at most <code>max_accuracy_drop</code> test accuracy (0.05 by default) "
    "are ranked by that share, fewest first, ties shown as ties; <i>Pareto</i> marks those no "
    "other beats on both privacy and accuracy."
)

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.4; }
table.leaderboard { border-collapse: collapse; font-size: 0.8em; }
table.leaderboard th, table.leaderboard td { padding: 2px 6px; border-bottom: 1px solid #ddd;
       text-align: right; }
table.leaderboard td:nth-child(-n+2), table.leaderboard th:nth-child(-n+2) { text-align: left; }
table.leaderboard th button { font: inherit; color: inherit; background: none; border: 0;
       padding: 0; width: 100%; cursor: pointer; text-align: inherit; }
table.env td { padding: 1px 8px; font-size: 0.85em; overflow-wrap: anywhere; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; }
div.scroll { overflow-x: auto; max-width: 100%; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; }
figcaption { font-size: 0.85em; color: #444; }
table.headline { border-collapse: collapse; font-size: 0.85em; }
table.headline th, table.headline td { padding: 2px 8px; border-bottom: 1px solid #ddd;
       text-align: left; vertical-align: top; }
table.headline td.n { text-align: right; white-space: nowrap; }
"""

# Sorts the leaderboard on a header click. Each header's text moves into a button (so the sort
# is reachable by keyboard too) followed by a marker; aria-sort names the sorted column. A cell
# holding "–" or nothing has no value and goes last in either direction; ties keep plan order.
_SORT_SCRIPT = """
(function () {
  var table = document.getElementById("TABLE_ID");
  if (!table) { return; }
  var body = table.tBodies[0];
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  function value(cell, numeric) {
    var text = cell.textContent.trim();
    if (text === "" || text === "\u2013") { return null; }
    if (!numeric) { return text; }
    var number = parseFloat(text);
    return isNaN(number) ? null : number;
  }
  heads.forEach(function (th, column) {
    var numeric = th.getAttribute("data-type") === "number";
    var button = document.createElement("button");
    var marker = document.createElement("span");
    button.type = "button";
    while (th.firstChild) { button.appendChild(th.firstChild); }
    marker.setAttribute("aria-hidden", "true");
    button.appendChild(marker);
    th.appendChild(button);
    button.addEventListener("click", function () {
      var sign = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      var rows = Array.prototype.slice.call(body.rows).map(function (tr) {
        return { key: value(tr.cells[column], numeric), tr: tr };
      });
      rows.sort(function (a, b) {
        if (a.key === null || b.key === null) { return (a.key === null) - (b.key === null); }
        var order = numeric ? a.key - b.key : a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
        return sign * order;
      });
      rows.forEach(function (row) { body.appendChild(row.tr); });
      heads.forEach(function (other) {
        other.removeAttribute("aria-sort");
        other.querySelector("button span").textContent = "";
      });
      th.setAttribute("aria-sort", sign > 0 ? "ascending" : "descending");
      marker.textContent = sign > 0 ? " \u25b2" : " \u25bc";
    });
  });
})();
""".replace("TABLE_ID", HTML_TABLE_ID)


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    others: Sequence[str | Path] = (),
    trials: pd.DataFrame | None = None,
    board: pd.DataFrame | None = None,
) -> Path:
    """Writes the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``); the
    leaderboards of the ``others`` run directories join its leakage figure, as in
    `leakbench.outputs.figures.write_figures`. A text run's page (`text_page`) is made from
    ``trials`` and ``board`` when given (the run's tables in memory), else from its CSVs."""
    path = Path(run_dir)
    modality = run_modality(path) if trials is None else modality_of(trials.columns).modality
    if modality == "text":
        if trials is None or board is None:
            trials = pd.read_csv(path / "trials.csv", keep_default_na=False, na_values=[""])
            board = pd.read_csv(path / "leaderboard.csv")
        target = path / "report.html" if out is None else Path(out)
        write_text(target, text_page(path, trials, board))
        return target
    run = load_run(run_dir, others)
    target = Path(out) if out is not None else run.path / "report.html"
    config = _read(run.path / "config.toml")
    made_with = _read(run.path / ENVIRONMENT_FILE)
    name = _run_name(run.trials, run.path)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>leakbench report: {html.escape(name)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>leakbench report: {html.escape(name)}</h1>",
        f"<p>Run directory <code>{html.escape(str(run.path))}</code>; "
        f"{int(run.leaderboard['n'].sum())} scored images in {len(run.leaderboard)} cells, "
        f"{len(run.utility)} utility trainings.</p>",
        "<h2>Verdicts</h2>",
        _headline(run),
        _summary(run),
    ]
    figures = _figures(run)
    # The leaderboard first, under the verdicts; its wide table scrolls inside its own box.
    parts += [
        "<h2>Leaderboard</h2>",
        f"<p>{RANKING_RULE} Best value of each column in bold. Click a column's header to "
        "sort the rows by it, again to reverse.</p>",
        f'<div class="scroll">{to_html(run.leaderboard)}</div>',
        *_audit_section(run),
    ]
    parts += [figures.pop(key) for key in LEADING_FIGURES if key in figures]
    parts += ["<h2>More figures</h2>", *figures.values()]
    parts += [
        "<h2>Config</h2>",
        f"<pre>{html.escape(config or '(config.toml is missing)')}</pre>",
        "<h2>Environment</h2>",
        _environments(made_with),
        f"<script>{_SORT_SCRIPT}</script>",
        "</body></html>",
    ]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, "\n".join(parts) + "\n")
    except OSError as err:
        raise DataError(f"--out {target} cannot be written: {err.strerror}") from None
    return target


# The figures shown right after the verdicts, before the table.
LEADING_FIGURES = ("privacy_utility", "reconstructions")


def _headline(run: Run) -> str:
    """The table `leakbench run` prints, one row per defense configuration (its strongest
    attack's), as HTML, with a column naming the (dataset, model) pair where there are
    several: each verdict on its own row, first on the page."""
    header, rows, settings = headline_rows(run.leaderboard)
    if any(settings):
        header = ["dataset/model", *header]
        rows = [[setting, *cells] for setting, cells in zip(settings, rows, strict=True)]
    classes = ["n" if h in NUMERIC_HEADLINE else "t" for h in header]
    cells = [[html.escape(c) for c in row] for row in rows]
    return f'<div class="scroll">{_table("headline", header, cells, classes)}</div>'


def _summary(run: Run) -> str:
    """The verdicts in words: one list item per verdict that occurs, naming its defenses."""
    items = "".join(
        f"<li><b>{html.escape(name)}</b>: {html.escape('; '.join(texts))}</li>"
        for name, texts in verdict_lines(run.leaderboard)
    )
    return f'<ul class="verdicts">{items}</ul>' if items else "<p>No verdicts.</p>"


def _figures(run: Run) -> dict[str, str]:
    """Each figure of `leakbench.outputs.figures` as an HTML figure (or a note why it is
    missing)."""
    out = {}
    with paper_style():
        for key, draw in FIGURES.items():
            try:
                fig = draw(run)
            except FigureSkipped as why:
                out[key] = f"<p><i>{key}: not drawn ({html.escape(str(why))}).</i></p>"
                continue
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=150, metadata={"Software": None})
            data = base64.b64encode(buffer.getvalue()).decode("ascii")
            out[key] = (
                f'<figure id="{key}"><img alt="{key}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(CAPTIONS.get(key, key))}</figcaption></figure>"
            )
    return out


AUDIT_TEXT = (
    "Each defense configuration's update was audited with gradient canaries: in a seeded half "
    "of the rounds the client's batch holds one more example whose gradient is a Dirac canary "
    "(zero but in one coordinate), in the other half an example of zero gradient; the server "
    "scores each round's defended update by its value in that coordinate. <i>Distribution-free"
    "</i>: the threshold test is chosen on the first half of the rounds and judged on the "
    "second with Clopper-Pearson bounds (Jagielski et al. 2020; Nasr et al. 2023), a lower bound "
    "on epsilon that holds with the stated confidence whatever the mechanism. <i>Gaussian-DP</i> "
    "(only for defenses whose score is a Gaussian shift: DP-SGD, Gaussian noise): a lower "
    "confidence bound on mu from the same test's two error rates, then epsilon(mu, delta) "
    "(Dong, Roth and Su 2022), with several canaries per round. <i>RDP</i> and <i>PLD</i> are "
    "dp-accounting's Renyi-DP and privacy-loss-distribution accountants of one such update (PLD "
    "is exact for the Gaussian mechanism); a measured bound above PLD is a <b>failed</b> audit "
    "(a bug). The confidence of guaranteed defenses is Bonferroni-corrected over the run's "
    "guaranteed configurations. A defense whose output depends on the batch (relative noise, "
    "Soteria, pruning, a clip of the whole update) is audited on several client batches "
    "(<i>batches</i>), round r on batch r mod batches, each score taken relative to its "
    "batch's own contribution; one that acts on the data (MixUp) gets an <i>input</i> canary, "
    "an example added to the batch before the mixing, scored by the update's projection on "
    "the canary's own gradient. <i>About</i>: a defense with a guarantee is bounded by its "
    "accountant; for any other the bound is the <b>canary's</b> (its norm and place), not the "
    "defense's, and for noise without clipping the canary's shift over the noise's std "
    "(<i>canary mu</i>; exactly the Gaussian-DP mu for Gaussian noise) decides it: a larger "
    "canary shows through any such noise."
)


def _audit_section(run: Run) -> list[str]:
    """The epsilon audit (``epsilon_audit.csv``) as a table and its figure, if the run has
    one."""
    path = run.path / FILE
    if not path.is_file():
        return []
    audit = pd.read_csv(path)

    def number(value: float) -> str:
        return "\u2013" if pd.isna(value) else f"{value:.2f}"

    rows = [
        [html.escape(defense_label(r["defense"], r["defense_params"])),
         number(r["epsilon_update"]), number(r.get("epsilon_exact")), number(r["epsilon_audit"]),
         number(r.get("epsilon_audit_gdp")), f"{r['epsilon_audit_confidence']:.4g}",
         number(r["epsilon_audit_cap"]), number(r["tpr_at_1pct_fpr"]), number(r["auroc"]),
         str(int(r["rounds"])), str(int(r.get("batches", 1))),
         html.escape(str(r.get("canary_type", "gradient"))), number(r.get("canary_mu")),
         html.escape(str(r.get("bound_of", ""))), html.escape(str(r["audit"]))]
        for r in audit.to_dict("records")
    ]  # fmt: skip
    headings = ("defense", "RDP", "PLD", "distribution-free", "Gaussian-DP", "confidence",
                "most shown", "TPR at 1% FPR", "AUROC", "rounds", "batches", "canary",
                "canary mu", "about", "audit")  # fmt: skip
    parts = [
        "<h2>Measured privacy</h2>",
        f"<p>{AUDIT_TEXT}</p>",
        _table("leaderboard", headings, rows),
    ]
    with paper_style():
        try:
            fig = epsilon_audit(audit)
        except FigureSkipped:
            return parts
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=150, metadata={"Software": None})
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    parts.append(
        f'<figure id="epsilon_audit"><img alt="epsilon_audit" '
        f'src="data:image/png;base64,{data}"><figcaption>The measured lower bounds on epsilon '
        "per defense configuration (distribution-free; Gaussian-DP where the score is Gaussian), "
        "the accountants' epsilons of one update (RDP, PLD) where there are, and the most the "
        "distribution-free bound could show in its rounds.</figcaption></figure>"
    )
    return parts


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DataError(f"{path} cannot be read: {err.strerror}") from None


def _run_name(trials: pd.DataFrame, path: Path) -> str:
    """The config's ``name`` (every trial row carries it), else the directory's name."""
    return str(trials["run"].iloc[0]) if len(trials) else path.name


def _environments(made_with: str | None) -> str:
    """A table of the run's environment beside the report's."""
    report = describe_environment()
    run: dict[str, object] = {}
    if made_with:
        try:
            run = json.loads(made_with)
        except json.JSONDecodeError:
            run = {}
    keys = list(dict.fromkeys([*run, *report]))
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(_text(run.get(k, '–')))}</td>"
        f"<td>{html.escape(_text(report.get(k, '–')))}</td></tr>"
        for k in keys
    )
    note = "" if made_with else "<p>The run directory holds no environment.json.</p>"
    return (
        f'{note}<table class="env"><tr><th></th><th>run (latest invocation)</th>'
        f"<th>this report</th></tr>{rows}</table>"
    )


def _text(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "–" if value is None else str(value)


def _table(
    css: str,
    headings: Iterable[str],
    rows: Iterable[Iterable[str]],
    classes: list[str] | None = None,
) -> str:
    """An HTML table of class ``css``: the escaped ``headings``, then ``rows`` of cells given
    as HTML (``classes``: each column's cell class)."""
    headings = list(headings)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headings)
    opening = (
        ["<td>"] * len(headings) if classes is None else [f'<td class="{c}">' for c in classes]
    )
    body = "".join(
        "<tr>" + "".join(f"{o}{c}</td>" for o, c in zip(opening, row, strict=True)) + "</tr>"
        for row in rows
    )
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value: object) -> str:
    """A text run's table cell: a number in three significant digits (empty for NaN), else the
    escaped text."""
    if isinstance(value, float):
        return "" if value != value else f"{value:.3g}"
    return html.escape(str(value))


# A text run's leaderboard on its page, with the headings.
TEXT_PAGE_COLUMNS = {
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
# A text run's epsilon audit (``epsilon_audit.csv``) on its page, with the headings.
TEXT_AUDIT_COLUMNS = {
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
# Sentences shown per (defense, batch size, attack): the first batch of the first seed, at most.
EXAMPLES = 4

_TEXT_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.4; }
table { border-collapse: collapse; font-size: 0.8em; }
th, td { padding: 2px 6px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
mark { background: #c8f0c8; }
"""


def _labelled(frame: pd.DataFrame, kind: str) -> list[str]:
    """A text run's labels of the ``kind`` (attack or defense) of each row of ``frame``:
    only the parameters that differ from the defaults (`leakbench.outputs.naming`)."""
    pairs = zip(frame[kind].astype(str), frame[f"{kind}_params"].astype(str), strict=True)
    if kind == "attack":
        return [attack_label(name, params) for name, params in pairs]
    return [defense_label(name, params, short=True) for name, params in pairs]


def text_leaderboard_html(board: pd.DataFrame) -> str:
    """The strongest attack's row of each (defense, batch size) as an HTML table."""
    heads = board[board["strongest"].astype(bool)]
    heads = heads.assign(defense=_labelled(heads, "defense"), attack=_labelled(heads, "attack"))
    rows = [[_cell(r[c]) for c in TEXT_PAGE_COLUMNS] for _, r in heads.iterrows()]
    return _table("leaderboard", TEXT_PAGE_COLUMNS.values(), rows)


def example_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The sentences a text run's page shows: of each (batch size, defense, attack), the first
    batch of the first seed (at most `EXAMPLES` sentences), labelled with the batch size."""
    if trials.empty:
        return trials
    first = trials[(trials["seed"] == trials["seed"].iloc[0]) & (trials["batch_index"] == 0)]
    first = first[first["position"] < EXAMPLES]
    sizes = [f" (B = {b})" for b in first["batch_size"]]
    return first.assign(
        defense=[f"{d}{b}" for d, b in zip(_labelled(first, "defense"), sizes, strict=True)],
        attack=_labelled(first, "attack"),
    )


def text_audit_html(out: Path) -> list[str]:
    """A text run's epsilon audit (``out/epsilon_audit.csv``) as a section of its page;
    nothing when the run has none."""
    path = out / FILE
    if not path.is_file():
        return []
    audit = pd.read_csv(path)
    audit["defense"] = _labelled(audit, "defense")
    rows = [[_cell(r[c]) for c in TEXT_AUDIT_COLUMNS] for _, r in audit.iterrows()]
    return [
        "<h2>Measured privacy</h2>",
        "<p>Per batch size and defense, lower bounds on the epsilon of one update measured with "
        "Dirac gradient canaries in the token embedding (distribution-free, and Gaussian-DP "
        "where the score is Gaussian), beside the accountants' epsilons of that update (RDP, "
        "and the exact PLD value that decides the audit). A bound above the exact value fails "
        "the audit; for a defense without a guarantee the bound is the canary's.</p>",
        _table("audit", TEXT_AUDIT_COLUMNS.values(), rows),
    ]


def text_page(out: Path, trials: pd.DataFrame, board: pd.DataFrame) -> str:
    """The HTML page of the text run in ``out`` from its ``trials`` and ``board``."""
    config = _read(out / "config.toml")
    name = _run_name(trials, out)
    page = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>leakbench text run {html.escape(name)}</title><style>{_TEXT_STYLE}</style></head>",
        f"<body><h1>Text run {html.escape(name)}</h1>",
        "<h2>Leaderboard</h2>",
        "<p>Per batch size and defense, its strongest attack: sentences leaked over the suite "
        "(exact recovery or ROUGE-2 at or above the leak threshold, by any attack), mean "
        "ROUGE F, exact recovery and token accuracy of that attack, and the defense's "
        "perplexity on held-out private sentences (lower is better). leaderboard.csv holds "
        "every attack.</p>",
        text_leaderboard_html(board),
        *text_audit_html(out),
        sentences_html(example_rows(trials)),
        f"<h2>Config</h2><pre>{html.escape(config or '(config.toml is missing)')}</pre>",
        "</body></html>",
    ]
    return "\n".join(page) + "\n"


# The columns `sentences_html` reads, and what each holds.
SENTENCE_COLUMNS = {
    "defense": "the defense's printed label (one table per value)",
    "attack": "the attack's printed label",
    "text": "the private sentence, words separated by spaces",
    "reconstruction": "the reconstruction matched to it, words separated by spaces",
    "rouge1": "ROUGE-1 F in [0, 1] (NaN: not scored)",
    "rouge2": "ROUGE-2 F in [0, 1] (NaN: not scored)",
    "exact": "whether the reconstruction equals the sentence, id for id",
    "leaked": "whether the sentence leaked by the leak rule",
}

_SENTENCES_STYLE = """<style>
section.text-examples table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1em; }
section.text-examples th, section.text-examples td { padding: 2px 6px; text-align: left;
       border-bottom: 1px solid #ddd; vertical-align: top; }
section.text-examples td.num { text-align: right; }
section.text-examples tr.leaked td.flag { color: #b00; font-weight: bold; }
section.text-examples mark { background: #ffe08a; }
</style>"""


def marked_reconstruction(text: str, reconstruction: str) -> str:
    """The reconstruction as escaped HTML, each token that equals the original's token at the
    same position wrapped in ``<mark>``."""
    original = str(text).split()
    out = []
    for i, token in enumerate(str(reconstruction).split()):
        escaped = html.escape(token)
        same = i < len(original) and original[i] == token
        out.append(f"<mark>{escaped}</mark>" if same else escaped)
    return " ".join(out)


def _score(value: object) -> str:
    number = float(value)  # type: ignore[arg-type]
    return "–" if math.isnan(number) else f"{number:.2f}"


def _sentence_row(r: pd.Series) -> str:
    leaked = bool(r["leaked"])
    exact = "yes" if bool(r["exact"]) else "no"
    return (
        f'<tr class="{"leaked" if leaked else "kept"}">'
        f"<td>{html.escape(str(r['attack']))}</td>"
        f"<td>{html.escape(str(r['text']))}</td>"
        f"<td>{marked_reconstruction(r['text'], r['reconstruction'])}</td>"
        f'<td class="num">{_score(r["rouge1"])}</td><td class="num">{_score(r["rouge2"])}</td>'
        f'<td class="flag">{exact}</td><td class="flag">{"yes" if leaked else "no"}</td></tr>'
    )


def sentences_html(rows: pd.DataFrame) -> str:
    """A text run's private sentences beside their reconstructions, as an HTML fragment (a
    ``<section>`` with its own small ``<style>``); ``rows`` holds the `SENTENCE_COLUMNS`, one
    row per sentence and attack.

    Per defense, in the order the defenses first appear in ``rows``, a table of the attacks'
    reconstructions, each beside its original sentence, with ROUGE-1, ROUGE-2 and the exact and
    leaked flags (the leak rule, `leakbench.components.text_metrics.LEAK_RULE`, is stated under
    the heading). In the reconstruction, every token that equals the original's token at the
    same position is marked (``<mark>``): the tokens are the sentences' space-separated words,
    as `leakbench.components.text_metrics.decode` writes them (the reserved tokens dropped, so a
    ``<unk>`` in the original shifts the positions after it). Every value from ``rows`` is
    escaped (``html.escape``), so a sentence holding ``<``, ``&`` or quotes shows as written.

    Raises:
        DataError: If a column is missing (one line naming them).
    """
    missing = [c for c in SENTENCE_COLUMNS if c not in rows.columns]
    if missing:
        raise DataError(f"text examples: missing column(s) {', '.join(missing)}")
    head = (
        "<tr><th>attack</th><th>original</th><th>reconstruction</th><th>ROUGE-1</th>"
        "<th>ROUGE-2</th><th>exact</th><th>leaked</th></tr>"
    )
    parts = [
        _SENTENCES_STYLE,
        '<section class="text-examples">',
        "<h2>Reconstructed sentences</h2>",
        f"<p>Marked: tokens of the reconstruction equal to the original's at the same place. "
        f"{html.escape(LEAK_RULE[0].upper() + LEAK_RULE[1:])}.</p>",
    ]
    if rows.empty:
        parts.append("<p>No text reconstructions.</p>")
    for defense in pd.unique(rows["defense"]):
        group = rows[rows["defense"] == defense]
        body = "".join(_sentence_row(r) for _, r in group.iterrows())
        parts.append(
            f"<h3>{html.escape(str(defense))}</h3>"
            f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"
        )
    parts.append("</section>")
    return "\n".join(parts)
