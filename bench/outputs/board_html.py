"""The board as one static page: a table per protocol, dataset and threat model, sortable by a
click on a header and filtered by a search box, in plain HTML with a few lines of inline script
(nothing fetched). Where the board is under 900 px wide (a CSS container query, so also inside
the docs' content column) each row becomes a card of labelled fields, and the page never scrolls
sideways."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.outputs.board import APART_CSV, BOARD_CSV, Board, table_order
from leakbench.outputs.tables import write_csv, write_text

_STYLE = """
.lb-board { font-family: system-ui, sans-serif; color: #222; line-height: 1.35;
  max-width: 100%; overflow-wrap: break-word; container-type: inline-size; }
.lb-board h2 { font-size: 1.05em; margin: 1.6em 0 0.3em; }
.lb-board table { border-collapse: collapse; width: 100%; font-size: 0.78em;
  table-layout: auto; }
.lb-board th, .lb-board td { padding: 3px 5px; border-bottom: 1px solid #ddd;
  text-align: left; vertical-align: top; }
.lb-board th button { font: inherit; color: inherit; background: none; border: 0;
  padding: 0; cursor: pointer; text-align: left; }
.lb-board .flag { color: #b00020; font-weight: 600; }
.lb-board .small { font-size: 0.9em; color: #555; }
.lb-board input[type=search] { width: 100%; max-width: 30em; box-sizing: border-box;
  font: inherit; padding: 4px; }
.lb-board details summary { cursor: pointer; }
@container (max-width: 900px) {
  .lb-board table, .lb-board tbody, .lb-board tr, .lb-board td { display: block; width: auto; }
  .lb-board thead { display: block; }
  .lb-board thead tr { display: flex; flex-wrap: wrap; gap: 2px 8px; }
  .lb-board thead th { border: 0; padding: 1px 0; }
  .lb-board tr { border: 1px solid #ccc; margin: 0.5em 0; padding: 4px; }
  .lb-board td { border: 0; padding: 1px 0; }
  .lb-board td::before { content: attr(data-label) ": "; font-weight: 600; }
}
"""

# Sorting: a header click sorts its table's rows by the cells' data-sort (numbers) or text; a
# second click reverses; empty values go last. Filtering: a row is shown when its text and its
# table's heading hold every word of the search box; a table with no row left is hidden.
_SCRIPT = """
(function () {
  function key(td, numeric) {
    var raw = td.getAttribute("data-sort");
    var text = raw === null ? td.textContent.trim() : raw;
    if (text === "") { return null; }
    if (!numeric) { return text.toLowerCase(); }
    var x = parseFloat(text); return isNaN(x) ? null : x;
  }
  document.querySelectorAll(".lb-board table").forEach(function (table) {
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      var button = document.createElement("button");
      button.type = "button";
      while (th.firstChild) { button.appendChild(th.firstChild); }
      th.appendChild(button);
      button.addEventListener("click", function () {
        var numeric = th.getAttribute("data-type") === "number";
        var sign = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows).map(function (tr) {
          return { k: key(tr.cells[col], numeric), tr: tr };
        });
        rows.sort(function (a, b) {
          if (a.k === null || b.k === null) { return (a.k === null) - (b.k === null); }
          return sign * (a.k < b.k ? -1 : a.k > b.k ? 1 : 0);
        });
        rows.forEach(function (r) { body.appendChild(r.tr); });
        heads.forEach(function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", sign > 0 ? "ascending" : "descending");
      });
    });
  });
  var box = document.getElementById("lb-filter");
  if (!box) { return; }
  box.addEventListener("input", function () {
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean);
    document.querySelectorAll(".lb-board section").forEach(function (section) {
      var shown = 0, head = section.querySelector("h2").textContent;
      section.querySelectorAll("tbody tr").forEach(function (tr) {
        var text = (head + " " + tr.textContent).toLowerCase();
        var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
        tr.hidden = !keep; shown += keep ? 1 : 0;
      });
      section.hidden = shown === 0;
    });
  });
})();
"""

# (header, kind) of the page's columns; the CSV has every column.
_HEADERS = [
    ("rank", "number"), ("defense", "text"), ("model", "text"), ("model state", "text"),
    ("leaked over the suite", "number"), ("strongest attack", "text"),
    ("identified / recognisable", "number"), ("utility", "number"),
    ("accuracy cost", "number"), ("epsilon: training / one update / measured", "number"),
    ("budget share", "number"), ("verdict", "text"), ("verified", "text"),
    ("provenance", "text"),
]  # fmt: skip


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 3) -> str:
    return "" if math.isnan(x) else f"{x:.{digits}g}"


def _interval(mean: float, half: float, bounds: tuple[float, float]) -> str:
    """``mean [low–high]``: the 95% interval ``mean ± half`` cut to what the quantity can be
    (two seeds' t interval on accuracy can reach far past 0% and 100%)."""
    if math.isnan(mean):
        return ""
    if math.isnan(half):
        return _pct(mean)
    low, high = max(bounds[0], mean - half), min(bounds[1], mean + half)
    return f"{_pct(mean)} [{_pct(low)}–{_pct(high)}]"


def _td(label: str, text: str, sort: Any = None, raw: bool = False) -> str:
    body = text if raw else html.escape(text)
    attr = "" if sort is None else f' data-sort="{html.escape(str(sort))}"'
    return f'<td data-label="{html.escape(label)}"{attr}>{body}</td>'


def _sort_value(x: float) -> str:
    return "" if math.isnan(x) else repr(float(x))


def _epsilons(row: pd.Series) -> str:
    parts = [_num(row[c]) or "–" for c in ("epsilon_training", "epsilon_update")]
    measured = _num(row["epsilon_measured"]) or "–"
    text = " / ".join([*parts, measured])
    if row["epsilon_exceeds"] is True:
        return f'{html.escape(text)} <span class="flag">measured &gt; promised</span>'
    return html.escape(text)


def _provenance(row: pd.Series) -> str:
    lines = [
        f"protocol {row['protocol'] or 'none'}; leakbench {row['leakbench']}, "
        f"engine {row['engine_version']}; commit {row['commit']}",
        f"config sha256 {str(row['config_sha256'])[:12]} ({row['config_hash']})",
        f"seeds {row['seeds']}; {row['environment']}",
        f"run folder {row['run_dir']}",
    ]
    body = "<br>".join(html.escape(line).replace("/", "/<wbr>") for line in lines)
    summary = html.escape(str(row["run_dir"])).replace("/", "/<wbr>")
    return f"<details><summary>{summary}</summary><div>{body}</div></details>"


def _utility(row: pd.Series) -> str:
    """The utility cell: an image run's test accuracy, a text run's perplexity (lower is better),
    each named; sorting puts higher accuracy and lower perplexity the same way round within a
    table (a table holds one kind)."""
    if math.isnan(row["test_accuracy"]) and not math.isnan(row["perplexity"]):
        text = f"perplexity {row['perplexity']:.1f}"
        return _td("utility", text, _sort_value(-row["perplexity"]))
    accuracy = _interval(row["test_accuracy"], row["test_accuracy_ci95"], (0.0, 1.0))
    text = f"accuracy {accuracy}" if accuracy else ""
    return _td("utility", text, _sort_value(row["test_accuracy"]))


def _row(row: pd.Series) -> str:
    rank = row["table_rank"]
    leaked = (
        f"{_pct(row['leaked_share'])} [{_pct(row['leaked_low'])}–{_pct(row['leaked_high'])}]"
        f" of {row['n']} ({row['leak_measure']})"
    )
    verdict = f'<span title="{html.escape(str(row["verdict_note"]))}">{html.escape(str(row["verdict"]))}</span>'  # noqa: E501
    if row["weak_evaluation"]:
        why = html.escape(str(row["weak_evaluation"]))
        engine = html.escape(str(row["engine_version"]) or "not recorded")
        verdict += f' <span class="flag" title="{why}">weak evaluation (engine {engine})</span>'
    cells = [
        _td("rank", "" if math.isnan(rank) else f"{rank:.0f}", _sort_value(rank)),
        _td("defense", str(row["defense_label"])),
        _td("model", str(row["model"])),
        _td("model state", str(row["model_state"])),
        _td("leaked over the suite", leaked, _sort_value(row["leaked_share"])),
        _td("strongest attack", str(row["strongest_attack"])),
        _td(
            "identified / recognisable",
            f"{_pct(row['identified_rate'])} / {_pct(row['recognisable_rate'])}",
            _sort_value(row["identified_rate"]),
        ),
        _utility(row),
        _td(
            "accuracy cost",
            _interval(row["accuracy_drop"], row["accuracy_drop_ci95"], (-1.0, 1.0)),
            _sort_value(row["accuracy_drop"]),
        ),  # fmt: skip
        _td("epsilon", _epsilons(row), _sort_value(row["epsilon_update"]), raw=True),
        _td("budget share", _pct(row["budget_share"]), _sort_value(row["budget_share"])),
        _td("verdict", verdict, raw=True),
        _td("verified", str(row["verification"])),
        _td("provenance", _provenance(row), raw=True),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def _table(name: str, rows: pd.DataFrame) -> str:
    heads = "".join(f'<th data-type="{kind}">{html.escape(h)}</th>' for h, kind in _HEADERS)
    body = "".join(_row(r) for _, r in rows.iterrows())
    return (
        f'<section><h2>{html.escape(name)}</h2><table class="lb"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{body}</tbody></table></section>"
    )


KEY = (
    "<p>One table per protocol, dataset and threat model; one row per defense configuration of "
    "a run. <i>Leaked over the suite</i>: the share of private images that any attack of the "
    "standard suite leaked (recovered, identified or recognisable), its exact 95% interval and "
    "the image count; <i>rank</i> orders the rows their run ranked, fewest leaked first. "
    "<i>Utility</i>: the defended model's test accuracy (mean over training seeds, its 95% "
    "interval in brackets, cut at 0% and 100%), or for a text run the perplexity of its language "
    "model on held-out private sentences (lower is better). <i>Accuracy cost</i>: accuracy "
    "without a defense minus with it, paired by seed (95% interval, cut at -100% and 100%). "
    "<i>Epsilon</i>: the accountant's promise for the whole "
    "training, its promise for one update, and the audit's measured lower bound for one update "
    "(flagged where it exceeds that promise). <i>Budget share</i>: the strongest attack's "
    "trials that stopped on their iteration budget rather than converging. <i>Weak "
    "evaluation</i>: the run was judged by an engine whose attacks were later made stronger "
    "(hover for what changed); its verdict may say a defense held where the stronger attack "
    "succeeds, so the row is ranked against nothing until it is rerun. Click a header to "
    "sort; type to filter.</p>"
)


def board_page(board: Board, title: str = "leakbench board", fragment: bool = False) -> str:
    """The board's HTML: a whole page, or (``fragment``) a block to embed in a docs page."""
    groups = sorted(board.rows.groupby("table", sort=False), key=lambda g: table_order(str(g[0])))
    sections = [_table(str(name), rows) for name, rows in groups]
    apart = "".join(
        f"<li><code>{html.escape(r.run_dir)}</code>: {html.escape(r.reason)}</li>"
        for r in board.apart.itertuples()
    )
    parts = [
        f"<style>{_STYLE}</style>",
        '<div class="lb-board">',
        KEY,
        '<p><input type="search" id="lb-filter" placeholder="filter: e.g. cifar10 broken" '
        'aria-label="filter the rows"></p>',
        *sections,
        f"<h2>Shown apart</h2><ul>{apart}</ul>" if apart else "",
        "</div>",
        f"<script>{_SCRIPT}</script>",
    ]
    block = "\n".join(parts)
    if fragment:
        return block + "\n"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title></head>"
        f'<body style="margin: 1em auto; max-width: 1400px; padding: 0 1em">'
        f"<h1>{html.escape(title)}</h1>\n{block}</body></html>\n"
    )


def docs_page(board: Board, command: str) -> str:
    """The board as a page of the docs site (Markdown around the HTML block)."""
    lines = [
        "# Board",
        "",
        "Every committed run directory, side by side: "
        f"{len(board.rows)} defense configurations in {board.rows['table'].nunique()} tables"
        + (f", {len(board.apart)} run directories shown apart." if len(board.apart) else "."),
        "How an entry is submitted and verified: [Submitting an entry](submit.md). "
        "The same rows as CSV: `docs/board/board.csv`; as a page of its own: "
        "[board.html](board.html). Written by:",
        "",
        "```bash",
        command,
        "```",
        "",
        board_page(board, fragment=True).replace("\n\n", "\n"),
    ]
    return "\n".join(lines)


def write_board(board: Board, out: Path, command: str) -> list[Path]:
    """Writes ``board.csv``, ``apart.csv``, ``board.html`` and ``index.md`` (the docs page)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, apart_path = out / BOARD_CSV, out / APART_CSV
    write_csv(board.rows, csv_path, list(board.rows.columns))
    write_csv(board.apart, apart_path, list(board.apart.columns))
    html_path, md_path = out / "board.html", out / "index.md"
    write_text(html_path, board_page(board))
    write_text(md_path, docs_page(board, command))
    return [csv_path, apart_path, html_path, md_path]
