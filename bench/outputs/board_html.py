"""The board as one static page: a summary of each table's best row, then a table per protocol,
dataset and threat model, sortable by a click on a header and filtered by a search box, in plain
HTML with a few lines of inline script (nothing fetched).

Rows come in rank order (unranked ones after, model states in natural order), and the rows of a
weaker engine are folded below the current ones. A table wider than its column scrolls sideways
inside its own box, so the page itself never does; only a narrow screen (a viewport media query,
so the docs' content column alone does not trigger it) shows each row as a card of labelled
fields. Every string reaches the page escaped, and with its control characters as character
references, so that nothing can end the Markdown block the docs page embeds it in; the CSVs
neutralise cells a spreadsheet would read as a formula."""

from __future__ import annotations

import csv
import html
import math
import os
import re
import shlex
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.core.files import atomic_file, write_text
from leakbench.outputs.board import APART_CSV, BOARD_CSV, Board, table_order
from leakbench.outputs.tables import write_csv

# Set by docs/board/build.sh: the command the docs page names as the one that wrote it.
COMMAND_ENV = "LEAKBENCH_BOARD_COMMAND"
# Below this viewport width each row becomes a card; above it a wide table scrolls in its box.
CARD_WIDTH_PX = 600

_STYLE = f"""
.lb-board {{ font-family: system-ui, sans-serif; color: #222; line-height: 1.35;
  max-width: 100%; overflow-wrap: break-word; }}
.lb-board h2 {{ font-size: 1.05em; margin: 1.6em 0 0.3em; }}
.lb-board .lb-scroll {{ overflow-x: auto; max-width: 100%; }}
.lb-board table {{ border-collapse: collapse; width: 100%; font-size: 0.78em;
  table-layout: auto; }}
.lb-board table.lb {{ min-width: 64em; }}
.lb-board .nw {{ white-space: nowrap; }}
.lb-board td[data-label="utility"] {{ min-width: 15ch; }}
.lb-board td[data-label="accuracy cost"] {{ white-space: nowrap; }}
.lb-board td[data-label="epsilon"] {{ min-width: 12ch; }}
.lb-board td[data-label="verdict"] {{ min-width: 13ch; }}
.lb-board td[data-label="defense"], .lb-board td[data-label="best defense"] {{ min-width: 12ch; }}
.lb-board td[data-label="provenance"] {{ min-width: 24ch; }}
.lb-board td[data-label="rows"] {{ white-space: nowrap; }}
.lb-board td[data-label="table"] {{ min-width: 20ch; }}
.lb-board td, .lb-board th {{ text-wrap: balance; }}
.lb-board th, .lb-board td {{ padding: 3px 5px; border-bottom: 1px solid #ddd;
  text-align: left; vertical-align: top; }}
.lb-board th {{ font-weight: 600; }}
.lb-board th button {{ font: inherit; color: inherit; background: none; border: 0;
  padding: 0; cursor: pointer; text-align: left; }}
.lb-board .flag {{ color: #b00020; font-weight: 600; }}
.lb-board .small {{ font-size: 0.9em; color: #555; }}
.lb-board input[type=search] {{ width: 100%; max-width: 30em; box-sizing: border-box;
  font: inherit; padding: 4px; }}
.lb-board details.lb-fold {{ display: block; font-size: inherit; color: inherit; margin: 0;
  padding: 0; border: 0; border-radius: 0; box-shadow: none; background: none; }}
.lb-board details.lb-fold > :last-child {{ margin-bottom: 0; }}
.lb-board details.lb-fold > summary {{ display: list-item; position: static; cursor: pointer;
  margin: 0; padding: 0; border: 0; background: none; font-weight: normal; min-height: 0;
  overflow: visible; }}
.lb-board details.lb-fold > summary::before,
.lb-board details.lb-fold > summary::after {{ content: none; display: none; }}
.lb-board details.lb-weak {{ margin: 0.4em 0 0; }}
.lb-board details.lb-weak > summary {{ color: #555; font-size: 0.9em; }}
@media (max-width: {CARD_WIDTH_PX}px) {{
  .lb-board table, .lb-board tbody, .lb-board tr, .lb-board td {{ display: block; width: auto; }}
  .lb-board table.lb, .lb-board td[data-label] {{ min-width: 0; }}
  .lb-board thead {{ display: block; }}
  .lb-board thead tr {{ display: flex; flex-wrap: wrap; gap: 2px 8px; }}
  .lb-board thead th {{ border: 0; padding: 1px 0; }}
  .lb-board tr {{ border: 1px solid #ccc; margin: 0.5em 0; padding: 4px; }}
  .lb-board td {{ border: 0; padding: 1px 0; }}
  .lb-board td::before {{ content: attr(data-label) ": "; font-weight: 600; }}
}}
"""

# Sorting: a header click sorts its table's rows by the cells' data-sort (numbers) or text (in
# natural order: "epoch-2" before "epoch-10"); a second click reverses; empty values go last.
# Filtering: a row is shown when its text and its table's heading hold every word of the search
# box; a table with no row left is hidden, and so is a fold of weaker rows with none left.
_SCRIPT = """
(function () {
  function key(td, numeric) {
    var raw = td.getAttribute("data-sort");
    var text = raw === null ? td.textContent.trim() : raw;
    if (text === "") { return null; }
    if (!numeric) { return text.toLowerCase(); }
    var x = parseFloat(text); return isNaN(x) ? null : x;
  }
  function compare(a, b) {
    if (typeof a === "string") {
      return a.localeCompare(b, undefined, { numeric: true, sensitivity: "base" });
    }
    return a < b ? -1 : a > b ? 1 : 0;
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
          return sign * compare(a.k, b.k);
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
      section.querySelectorAll("details.lb-weak").forEach(function (fold) {
        fold.hidden = fold.querySelector("tbody tr:not([hidden])") === null;
      });
      section.hidden = shown === 0;
    });
  });
})();
"""

# (header, kind) of the page's columns; the CSV has every column.
_HEADERS = [
    ("rank", "number"), ("defense", "text"), ("model", "text"), ("model state", "text"),
    ("leaked over the suite", "number"), ("verdict", "text"), ("utility", "number"),
    ("accuracy cost", "number"), ("strongest attack", "text"),
    ("identified / recognisable", "number"),
    ("epsilon: training / one update / measured", "number"), ("budget share", "number"),
    ("verified", "text"), ("provenance", "text"),
]  # fmt: skip
_SUMMARY_HEADERS = [
    ("table", "text"), ("best defense", "text"), ("leaked over the suite", "number"),
    ("utility", "number"), ("verified", "text"), ("rows", "number"),
]  # fmt: skip

# Characters that could end a line or a Markdown block, or hide what a line says: controls
# (Cc), format characters such as bidirectional overrides (Cf), line and paragraph separators.
_HIDDEN_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
# A CSV cell starting with one of these is a formula to a spreadsheet (OWASP, CSV injection),
# unless it is a plain decimal number, which a spreadsheet reads as that number.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _hidden(char: str) -> bool:
    return unicodedata.category(char) in _HIDDEN_CATEGORIES


def _esc(value: Any) -> str:
    """``value`` as HTML text: escaped, and with every control or invisible character as a
    numeric character reference, so that the markup holds no line break of its own."""
    text = html.escape(str(value))
    return "".join(f"&#{ord(c)};" if _hidden(c) else c for c in text)


def _text(value: Any) -> str:
    """A text cell as a string: empty for a missing value (NaN from a CSV, None, NA)."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    return str(value)


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


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
    body = text if raw else _esc(text)
    attr = "" if sort is None else f' data-sort="{_esc(sort)}"'
    return f'<td data-label="{_esc(label)}"{attr}>{body}</td>'


def _sort_value(x: float) -> str:
    return "" if math.isnan(x) else repr(float(x))


def _epsilons(row: pd.Series) -> str:
    parts = [_num(_float(row[c])) or "–" for c in ("epsilon_training", "epsilon_update")]
    measured = _num(_float(row["epsilon_measured"])) or "–"
    text = " / ".join([*parts, measured])
    if str(row["epsilon_exceeds"]) == "True":
        return f'{_esc(text)} <span class="flag">measured &gt; promised</span>'
    return _esc(text)


def _path_html(text: str) -> str:
    """A path as HTML that may break after each slash."""
    return _esc(text).replace("/", "/<wbr>")


def _provenance(row: pd.Series) -> str:
    lines = [
        f"protocol {_text(row['protocol']) or 'none'}; leakbench {_text(row['leakbench'])}, "
        f"engine {_text(row['engine_version'])}; commit {_text(row['commit'])}",
        f"config sha256 {_text(row['config_sha256'])[:12]} ({_text(row['config_hash'])})",
        f"seeds {_text(row['seeds'])}; {_text(row['environment'])}",
        f"run folder {_text(row['run_dir'])}",
    ]
    body = "<br>".join(_path_html(line) for line in lines)
    summary = _path_html(_text(row["run_dir"]))
    return f'<details class="lb-fold"><summary>{summary}</summary><div>{body}</div></details>'


def _utility_text(row: pd.Series) -> tuple[str, str]:
    """The utility of a row and its sort key: an image run's test accuracy, a text run's
    perplexity (lower is better, so its key is negated: within a table, which holds one kind,
    a better model sorts the same way round either way)."""
    accuracy, perplexity = _float(row["test_accuracy"]), _float(row["perplexity"])
    if math.isnan(accuracy) and not math.isnan(perplexity):
        return f"perplexity {perplexity:.1f}", _sort_value(-perplexity)
    shown = _interval(accuracy, _float(row["test_accuracy_ci95"]), (0.0, 1.0))
    return (f"accuracy {shown}" if shown else ""), _sort_value(accuracy)


def _utility(row: pd.Series) -> str:
    text, sort = _utility_text(row)
    return _td("utility", text, sort)


def _leaked(row: pd.Series) -> str:
    """The leaked share and its interval (kept on one line), then the image count and what
    was counted, as HTML."""
    share, low, high = (_float(row[c]) for c in ("leaked_share", "leaked_low", "leaked_high"))
    return (
        f'<span class="nw">{_pct(share)} [{_pct(low)}–{_pct(high)}]</span> '
        f'<span class="small">of {_esc(_text(row["n"]))} ({_esc(_text(row["leak_measure"]))})'
        "</span>"
    )


def _verdict(row: pd.Series) -> str:
    """The verdict (its note on hover), flagged where a weaker engine judged the row."""
    note, verdict = _esc(_text(row["verdict_note"])), _esc(_text(row["verdict"]))
    text = f'<span title="{note}">{verdict}</span>'
    why = _text(row["weak_evaluation"])
    if why:
        engine = _esc(_text(row["engine_version"]) or "not recorded")
        flag = f"weak evaluation (engine {engine})"
        text += f' <span class="flag" title="{_esc(why)}">{flag}</span>'
    return text


def _row(row: pd.Series) -> str:
    rank = _float(row["table_rank"])
    identified, recognisable = _float(row["identified_rate"]), _float(row["recognisable_rate"])
    drop = _float(row["accuracy_drop"])
    budget = _float(row["budget_share"])
    cells = [
        _td("rank", "" if math.isnan(rank) else f"{rank:.0f}", _sort_value(rank)),
        _td("defense", _text(row["defense_label"])),
        _td("model", _text(row["model"])),
        _td("model state", _text(row["model_state"])),
        _td(
            "leaked over the suite",
            _leaked(row),
            _sort_value(_float(row["leaked_share"])),
            raw=True,
        ),
        _td("verdict", _verdict(row), raw=True),
        _utility(row),
        _td(
            "accuracy cost",
            _interval(drop, _float(row["accuracy_drop_ci95"]), (-1.0, 1.0)),
            _sort_value(drop),
        ),
        _td("strongest attack", _text(row["strongest_attack"])),
        _td(
            "identified / recognisable",
            f"{_pct(identified)} / {_pct(recognisable)}",
            _sort_value(identified),
        ),
        _td("epsilon", _epsilons(row), _sort_value(_float(row["epsilon_update"])), raw=True),
        _td("budget share", _pct(budget), _sort_value(budget)),
        _td("verified", _text(row["verification"])),
        _td("provenance", _provenance(row), raw=True),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def natural_key(text: str) -> tuple[Any, ...]:
    """A sort key that orders the numbers inside a string by value: ``checkpoint epoch-2``
    before ``checkpoint epoch-10``. Text and number parts alternate, so keys compare cleanly."""
    parts = re.split(r"(\d+)", text.lower())
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))


def rank_order(rows: pd.DataFrame) -> pd.DataFrame:
    """A table's rows as the page lists them: the ranked ones by ``table_rank``, then the
    unranked ones by model and model state (in natural order), ties kept as they came."""
    ranks = [_float(r) for r in rows["table_rank"]]
    models = [natural_key(_text(m)) for m in rows["model"]]
    states = [natural_key(_text(s)) for s in rows["model_state"]]

    def key(i: int) -> tuple[Any, ...]:
        unranked = math.isnan(ranks[i])
        return (unranked, 0.0 if unranked else ranks[i], models[i], states[i], i)

    return rows.iloc[sorted(range(len(rows)), key=key)]


def _is_weak(rows: pd.DataFrame) -> pd.Series:
    """Which rows a weaker engine judged (a non-empty ``weak_evaluation``)."""
    return rows["weak_evaluation"].map(_text) != ""


def _table_html(rows: pd.DataFrame) -> str:
    heads = "".join(f'<th data-type="{kind}">{_esc(h)}</th>' for h, kind in _HEADERS)
    body = "".join(_row(r) for _, r in rows.iterrows())
    return (
        f'<div class="lb-scroll"><table class="lb"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _section(anchor: str, name: str, rows: pd.DataFrame) -> str:
    """One table of the board: its current rows in rank order, then a fold holding the rows a
    weaker engine judged."""
    ordered = rank_order(rows)
    weak = _is_weak(ordered)
    current, folded = ordered[~weak], ordered[weak]
    parts = [f'<section id="{anchor}"><h2>{_esc(name)}</h2>']
    if len(current):
        parts.append(_table_html(current))
    else:
        parts.append('<p class="small">Every row of this table awaits a rerun.</p>')
    if len(folded):
        count = f"{len(folded)} row{'s' if len(folded) > 1 else ''} from weaker engines"
        why = "judged before the attacks were made stronger; ranked against nothing until rerun"
        parts.append(
            f'<details class="lb-fold lb-weak"><summary>{count} ({why})</summary>'
            f"{_table_html(folded)}</details>"
        )
    parts.append("</section>")
    return "".join(parts)


def _summary_row(anchor: str, name: str, rows: pd.DataFrame) -> str:
    """The summary's line for one table: its top-ranked row, or why it has none."""
    ordered = rank_order(rows)
    weak = _is_weak(ordered)
    ranked = ordered[~weak & ordered["table_rank"].map(lambda r: not math.isnan(_float(r)))]
    counts = f"{len(ordered)}" + (f" ({int(weak.sum())} weaker)" if weak.any() else "")
    link = f'<a href="#{anchor}">{_esc(name)}</a>'
    if ranked.empty:
        cells = [
            _td("table", link, name, raw=True),
            _td("best defense", "no ranked row"),
            _td("leaked over the suite", "", ""),
            _td("utility", "", ""),
            _td("verified", ""),
        ]
    else:
        best = ranked.iloc[0]
        utility, sort = _utility_text(best)
        model = " ".join(filter(None, (_text(best["model"]), _text(best["model_state"]))))
        cells = [
            _td("table", link, name, raw=True),
            _td(
                "best defense",
                f'{_esc(_text(best["defense_label"]))} <span class="small">({_esc(model)})</span>',
                raw=True,
            ),
            _td(
                "leaked over the suite",
                _leaked(best),
                _sort_value(_float(best["leaked_share"])),
                raw=True,
            ),
            _td("utility", utility, sort),
            _td("verified", _text(best["verification"])),
        ]
    cells.append(_td("rows", counts, len(ordered)))
    return "<tr>" + "".join(cells) + "</tr>"


def _summary(groups: list[tuple[str, str, pd.DataFrame]]) -> str:
    heads = "".join(f'<th data-type="{kind}">{_esc(h)}</th>' for h, kind in _SUMMARY_HEADERS)
    body = "".join(_summary_row(anchor, name, rows) for anchor, name, rows in groups)
    return (
        '<div class="lb-summary"><h2>Best per dataset and threat model</h2>'
        '<p class="small">Each table\'s top-ranked row (the fewest images leaked over the '
        "suite among the rows its run ranked); the table's name leads to it.</p>"
        f'<div class="lb-scroll"><table class="lb-best"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{body}</tbody></table></div></div>"
    )


KEY = (
    "<p>One table per protocol, dataset and threat model; one row per defense configuration of "
    "a run. <i>Leaked over the suite</i>: the share of private images that any attack of the "
    "standard suite leaked (recovered, identified or recognisable), its exact 95% interval and "
    "the image count; <i>rank</i> orders the rows their run ranked, fewest leaked first, and the "
    "rows come in that order, unranked ones last. "
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
    "succeeds, so the row is ranked against nothing until it is rerun, and such rows are folded "
    "below each table's current ones. Click a header to sort; type to filter; a wide table "
    "scrolls sideways in its box.</p>"
)


def _groups(board: Board) -> list[tuple[str, str, pd.DataFrame]]:
    """(anchor, name, rows) of each table, in the board's table order."""
    groups = sorted(board.rows.groupby("table", sort=False), key=lambda g: table_order(str(g[0])))
    return [(f"lb-table-{i + 1}", str(name), rows) for i, (name, rows) in enumerate(groups)]


def _no_blank_lines(text: str) -> str:
    """``text`` without empty or blank lines: in Markdown, a blank line would end the HTML
    block the docs page embeds the board in."""
    return "\n".join(line for line in text.splitlines() if line.strip())


def board_page(board: Board, title: str = "leakbench board", fragment: bool = False) -> str:
    """The board's HTML: a whole page, or (``fragment``) a block to embed in a docs page."""
    groups = _groups(board)
    sections = [_section(anchor, name, rows) for anchor, name, rows in groups]
    apart = "".join(
        f"<li><code>{_esc(r.run_dir)}</code>: {_esc(r.reason)}</li>"
        for r in board.apart.itertuples()
    )
    parts = [
        f"<style>{_STYLE}</style>",
        '<div class="lb-board">',
        KEY,
        _summary(groups) if groups else "",
        '<p><input type="search" id="lb-filter" placeholder="filter: e.g. cifar10 broken" '
        'aria-label="filter the rows"></p>',
        *sections,
        f"<h2>Shown apart</h2><ul>{apart}</ul>" if apart else "",
        "</div>",
        f"<script>{_SCRIPT}</script>",
    ]
    block = _no_blank_lines("\n".join(parts))
    if fragment:
        return block + "\n"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title></head>"
        f'<body style="margin: 1em auto; max-width: 1400px; padding: 0 1em">'
        f"<h1>{_esc(title)}</h1>\n{block}</body></html>\n"
    )


def _shell_word(word: str) -> str:
    """One shell word, quoted for bash: `shlex.quote`, or, for a word holding a control or
    invisible character, an ANSI-C string (``$'...'``) that spells it as an escape, so that
    the command stays on one line and still names the same file."""
    if not any(_hidden(c) for c in word):
        return shlex.quote(word)
    out = []
    for c in word:
        if c in "\\'":
            out.append("\\" + c)
        elif _hidden(c):
            out.append(c.encode("unicode_escape").decode("ascii"))
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def one_line(text: str) -> str:
    """``text`` with each control or invisible character spelled as a visible escape
    (``\\n``, ``\\x1b``, ``\\u202e``), so that it shows on one line as what it holds."""
    return "".join(c.encode("unicode_escape").decode("ascii") if _hidden(c) else c for c in text)


def shown_command(command: str | Sequence[str] | None, board: Board, out: Path) -> str:
    """The command the docs page names as the one that wrote it, on one line.

    ``$LEAKBENCH_BOARD_COMMAND`` (set by ``docs/board/build.sh``) comes first; then a command
    given as its words (each quoted for the shell); then one given as a line, which is shown as
    it is apart from its control characters; without any, the `leakbench board` call that
    rebuilds this board from the run directories it holds."""
    override = os.environ.get(COMMAND_ENV, "").strip()
    if override:
        return one_line(override)
    if isinstance(command, str):
        return one_line(command)
    if command is not None:
        return " ".join(_shell_word(str(word)) for word in command)
    run_dirs = pd.unique(pd.concat([board.rows["run_dir"], board.apart["run_dir"]]).map(_text))
    words = ["leakbench", "board", *(d for d in run_dirs if d), "--out", out.as_posix()]
    return " ".join(_shell_word(word) for word in words)


def docs_page(board: Board, command: str) -> str:
    """The board as a page of the docs site (Markdown around the HTML block). ``command`` is
    shown as an HTML code block, escaped and with its control characters spelled as escapes:
    no run directory's name can end the block or add a line of Markdown."""
    lines = [
        # The table of contents would be empty (the tables' headings are HTML); hiding it gives
        # the tables its width.
        "---",
        "hide:",
        "  - toc",
        "---",
        "",
        "# Board",
        "",
        "Every committed run directory, side by side: "
        f"{len(board.rows)} defense configurations in {board.rows['table'].nunique()} tables"
        + (f", {len(board.apart)} run directories shown apart." if len(board.apart) else "."),
        "How an entry is submitted and verified: [Submitting an entry](submit.md). "
        "The same rows as CSV: `docs/board/board.csv`; as a page of its own: "
        "[board.html](board.html). Written by:",
        "",
        f'<pre><code class="language-bash">{_esc(one_line(command))}</code></pre>',
        "",
        board_page(board, fragment=True),
    ]
    return "\n".join(lines)


def _is_formula(value: Any) -> bool:
    """Whether a spreadsheet would run a CSV cell holding ``value`` as a formula."""
    return (
        isinstance(value, str)
        and value.startswith(_FORMULA_STARTS)
        and _DECIMAL.fullmatch(value) is None
    )


def _formula_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell a spreadsheet would take for a formula (starting with
    ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) prefixed with ``'``. Numbers, in
    numeric columns or written as text, are left as they are: a negative accuracy cost stays a
    number."""
    safe = frame.copy()
    for column in safe.columns:
        if pd.api.types.is_numeric_dtype(safe[column]) or pd.api.types.is_bool_dtype(safe[column]):
            continue
        values = safe[column]
        needs = values.map(_is_formula)
        if needs.any():
            safe[column] = values.astype(object).where(~needs, "'" + values[needs].astype(str))
    return safe


def _write_table(frame: pd.DataFrame, path: Path) -> None:
    """Writes ``frame`` as CSV with its formula cells neutralised (`_formula_safe`). Python's CSV
    writer leaves a field holding a lone carriage return unquoted, which a reader takes for the
    end of the row (the rest of the cell would start a row of its own, formula and all); a
    table with one has every text field quoted instead."""
    safe = _formula_safe(frame)
    text = [c for c in safe.columns if not pd.api.types.is_numeric_dtype(safe[c])]
    lone_cr = any(
        isinstance(value, str) and "\r" in value for c in text for value in safe[c].tolist()
    )
    if not lone_cr:
        write_csv(safe, path, list(safe.columns))
        return
    with atomic_file(path, "w", newline="") as handle:
        safe.to_csv(handle, index=False, quoting=csv.QUOTE_NONNUMERIC)


def write_board(board: Board, out: Path, command: str | Sequence[str] | None = None) -> list[Path]:
    """Writes ``board.csv``, ``apart.csv``, ``board.html`` and ``index.md`` (the docs page).

    ``command`` is what the docs page says wrote it (see `shown_command`: the environment's
    ``LEAKBENCH_BOARD_COMMAND`` overrides it). Text cells of the CSVs that a spreadsheet would
    run as a formula are written with a leading ``'``."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, apart_path = out / BOARD_CSV, out / APART_CSV
    _write_table(board.rows, csv_path)
    _write_table(board.apart, apart_path)
    html_path, md_path = out / "board.html", out / "index.md"
    write_text(html_path, board_page(board))
    write_text(md_path, docs_page(board, shown_command(command, board, out)))
    return [csv_path, apart_path, html_path, md_path]


def read_board(folder: Path) -> Board:
    """A board as `write_board` left it in ``folder`` (its ``board.csv`` and ``apart.csv``),
    with empty text cells as empty strings, to render it again without rebuilding it."""
    rows = pd.read_csv(folder / BOARD_CSV)
    apart_file = folder / APART_CSV
    apart = (
        pd.read_csv(apart_file, dtype=str, keep_default_na=False)
        if apart_file.is_file()
        else pd.DataFrame(columns=["run_dir", "reason"])
    )
    for column in rows.columns:
        if not pd.api.types.is_numeric_dtype(rows[column]):
            rows[column] = rows[column].astype(object).where(rows[column].notna(), "")
    return Board(rows, apart.reindex(columns=["run_dir", "reason"]))
