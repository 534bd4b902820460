"""A one-page, self-contained HTML report of a run directory.

The page holds the run's config, its leaderboard (the table of `leakbench.outputs.paper_tables`,
best values in bold), the ranking rule, every figure of `leakbench.outputs.figures` embedded as a
PNG data URI, and two environments: the one the run was made with (``environment.json``, written by
``leakbench run``) and the one that drew the report. Nothing is fetched when the page opens.

A few lines of inline script make the leaderboard sortable: a click on a header sorts the rows
by that column (numbers by the number a cell starts with, text alphabetically, cells without a
value last), a second click reverses the order. Without scripts the table stays in plan order.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path

from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import DISTRACTORS, RECOGNISABLE_LPIPS, RECOGNISABLE_PSNR
from leakbench.core.environment import ENVIRONMENT_FILE, describe_environment
from leakbench.core.errors import DataError
from leakbench.outputs.figures import FIGURES, Run, load_run
from leakbench.outputs.paper_tables import HTML_TABLE_ID, to_html, verdict_lines
from leakbench.outputs.plotting import FigureSkipped, paper_style
from leakbench.outputs.tables import BROKEN_SHARE, CONCLUSIVE_SHARE, MIN_BROKEN_IMAGES, write_text

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
    f"{RECOGNISABLE_PSNR:g} dB or LPIPS at most {RECOGNISABLE_LPIPS:g}). Every defense meets "
    f"the standard attack suite (protocol {PROTOCOL}: every attack family and the defense's "
    "adaptive attacks), and is judged by the images leaked under any of them, with the exact "
    "95% interval, never by a mean over images. <i>Verdict</i>: <code>broken</code> at "
    f"{BROKEN_SHARE:.0%} or more (and at least {MIN_BROKEN_IMAGES} images), "
    "<code>leaks</code> above 0, <code>holds</code> when no image leaked, the interval's upper "
    f"end is below {BROKEN_SHARE:.0%} (else <i>holds (underpowered)</i>) and every image was "
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
    run_dir: str | Path, out: str | Path | None = None, others: Sequence[str | Path] = ()
) -> Path:
    """Writes the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``); the
    leaderboards of the ``others`` run directories join its leakage figure, as in
    `leakbench.outputs.figures.write_figures`."""
    run = load_run(run_dir, others)
    target = Path(out) if out is not None else run.path / "report.html"
    config = _read(run.path / "config.toml")
    made_with = _read(run.path / ENVIRONMENT_FILE)
    name = _run_name(run)
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
    import pandas as pd

    from leakbench.outputs.epsilon_figure import FILE, epsilon_audit
    from leakbench.outputs.naming import defense_label

    path = run.path / FILE
    if not path.is_file():
        return []
    audit = pd.read_csv(path)

    def number(value: float) -> str:
        return "\u2013" if pd.isna(value) else f"{value:.2f}"

    rows = "".join(
        "<tr>"
        f"<td>{html.escape(defense_label(r['defense'], r['defense_params']))}</td>"
        f"<td>{number(r['epsilon_update'])}</td><td>{number(r.get('epsilon_exact'))}</td>"
        f"<td>{number(r['epsilon_audit'])}</td><td>{number(r.get('epsilon_audit_gdp'))}</td>"
        f"<td>{r['epsilon_audit_confidence']:.4g}</td><td>{number(r['epsilon_audit_cap'])}</td>"
        f"<td>{number(r['tpr_at_1pct_fpr'])}</td><td>{number(r['auroc'])}</td>"
        f"<td>{int(r['rounds'])}</td><td>{int(r.get('batches', 1))}</td>"
        f"<td>{html.escape(str(r.get('canary_type', 'gradient')))}</td>"
        f"<td>{number(r.get('canary_mu'))}</td>"
        f"<td>{html.escape(str(r.get('bound_of', '')))}</td>"
        f"<td>{html.escape(str(r['audit']))}</td></tr>"
        for r in audit.to_dict("records")
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("defense", "RDP", "PLD", "distribution-free", "Gaussian-DP", "confidence",
                  "most shown", "TPR at 1% FPR", "AUROC", "rounds", "batches", "canary",
                  "canary mu", "about", "audit")
    )  # fmt: skip
    parts = [
        "<h2>Measured privacy</h2>",
        f"<p>{AUDIT_TEXT}</p>",
        f'<table class="leaderboard"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>',
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


def _run_name(run: Run) -> str:
    """The config's ``name`` (every trial row carries it), else the directory's name."""
    if not run.trials.empty:
        return str(run.trials["run"].iloc[0])
    return run.path.name


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
