"""A text run's sentences on its report (`leakbench.outputs.report.sentences_html`): escaping,
in-place marking, the grouping by defense and the flags."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from leakbench.core.errors import DataError
from leakbench.outputs.report import SENTENCE_COLUMNS, marked_reconstruction, sentences_html


def _rows(**changes: object) -> pd.DataFrame:
    row = {
        "defense": "none",
        "attack": "span",
        "text": "the cat sat",
        "reconstruction": "the dog sat",
        "rouge1": 2 / 3,
        "rouge2": 0.0,
        "exact": False,
        "leaked": False,
    }
    return pd.DataFrame([{**row, **changes}])


def test_tokens_in_place_are_marked() -> None:
    assert (
        marked_reconstruction("the cat sat", "the dog sat")
        == "<mark>the</mark> dog <mark>sat</mark>"
    )
    # A shifted word is not in place; tokens past the original's end are never marked.
    assert marked_reconstruction("the cat", "cat the cat") == "cat the cat"
    assert marked_reconstruction("the cat", "a cat cat") == "a <mark>cat</mark> cat"
    assert marked_reconstruction("a", "") == ""


def test_everything_is_escaped() -> None:
    nasty = "<script>alert('x')</script> & \"so\""
    page = sentences_html(
        _rows(
            defense="<b>clip</b>", attack="a&b", text=f"{nasty} , <", reconstruction=f"{nasty} ; <"
        )
    )
    assert "<script>" not in page and "<b>clip</b>" not in page
    assert "&lt;b&gt;clip&lt;/b&gt;" in page and "a&amp;b" in page
    assert "<mark>&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;</mark>" in page
    assert "<mark>&amp;</mark>" in page and "<mark>&quot;so&quot;</mark>" in page
    # The comma and the semicolon differ in place; the final "<" agrees.
    assert "; <mark>&lt;</mark>" in page
    # Only the fragment's own tags remain once the escaped text is set aside.
    tags = set(re.findall(r"<(/?[a-z0-9]+)", page))
    assert tags <= {
        "style",
        "/style",
        "section",
        "/section",
        "h2",
        "/h2",
        "h3",
        "/h3",
        "p",
        "/p",
        "table",
        "/table",
        "thead",
        "/thead",
        "tbody",
        "/tbody",
        "tr",
        "/tr",
        "th",
        "/th",
        "td",
        "/td",
        "mark",
        "/mark",
    }


def test_one_table_per_defense_in_order_with_flags() -> None:
    rows = pd.concat(
        [
            _rows(defense="gaussian(0.1)"),
            _rows(
                defense="none",
                reconstruction="the cat sat",
                rouge1=1.0,
                rouge2=1.0,
                exact=True,
                leaked=True,
            ),
            _rows(defense="gaussian(0.1)", attack="match", rouge2=math.nan),
        ],
        ignore_index=True,
    )
    page = sentences_html(rows)
    assert page.count("<table>") == 2
    assert page.index("<h3>gaussian(0.1)</h3>") < page.index("<h3>none</h3>")
    assert page.count('<tr class="leaked">') == 1 and page.count('<tr class="kept">') == 2
    exact_row = page[page.index('<tr class="leaked">') :]
    assert "<mark>the</mark> <mark>cat</mark> <mark>sat</mark>" in exact_row
    assert '<td class="num">1.00</td><td class="num">1.00</td>' in exact_row
    assert '<td class="num">0.67</td><td class="num">–</td>' in page  # NaN shows as a dash
    assert "ROUGE-2 F &gt;= 0.5" in page  # the leak rule, stated


def test_missing_columns_and_no_rows() -> None:
    with pytest.raises(DataError, match="missing column\\(s\\) exact, leaked"):
        sentences_html(_rows().drop(columns=["exact", "leaked"]))
    assert "No text reconstructions" in sentences_html(pd.DataFrame(columns=list(SENTENCE_COLUMNS)))
