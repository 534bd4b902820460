"""The text track's section of the HTML report: private sentences beside their reconstructions.

`text_examples_html(rows)` is an HTML fragment (a ``<section>`` with its own small ``<style>``):
per defense, in the order the defenses first appear in ``rows``, a table of the attacks'
reconstructions, each beside its original sentence, with ROUGE-1, ROUGE-2 and the exact and
leaked flags (the leak rule, `leakbench.components.text_metrics.LEAK_RULE`, is stated under
the heading). In the reconstruction, every token that equals the original's token at the same
position is marked (``<mark>``): the tokens are the sentences' space-separated words, as
`leakbench.components.text_metrics.decode` writes them (the reserved tokens dropped, so a
``<unk>`` in the original shifts the positions after it). Every value from ``rows`` is escaped
(``html.escape``), so a sentence holding ``<``, ``&`` or quotes shows as written.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from leakbench.components.text_metrics import LEAK_RULE
from leakbench.core.errors import DataError

# The columns `text_examples_html` reads, and what each holds.
COLUMNS = {
    "defense": "the defense's printed label (one table per value)",
    "attack": "the attack's printed label",
    "text": "the private sentence, words separated by spaces",
    "reconstruction": "the reconstruction matched to it, words separated by spaces",
    "rouge1": "ROUGE-1 F in [0, 1] (NaN: not scored)",
    "rouge2": "ROUGE-2 F in [0, 1] (NaN: not scored)",
    "exact": "whether the reconstruction equals the sentence, id for id",
    "leaked": "whether the sentence leaked by the leak rule",
}

_STYLE = """<style>
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


def _flag(value: object) -> str:
    return "yes" if bool(value) else "no"


def _row(r: pd.Series) -> str:
    leaked = bool(r["leaked"])
    return (
        f'<tr class="{"leaked" if leaked else "kept"}">'
        f"<td>{html.escape(str(r['attack']))}</td>"
        f"<td>{html.escape(str(r['text']))}</td>"
        f"<td>{marked_reconstruction(r['text'], r['reconstruction'])}</td>"
        f'<td class="num">{_score(r["rouge1"])}</td><td class="num">{_score(r["rouge2"])}</td>'
        f'<td class="flag">{_flag(r["exact"])}</td><td class="flag">{_flag(leaked)}</td></tr>'
    )


def text_examples_html(rows: pd.DataFrame) -> str:
    """The report's fragment of original and reconstructed sentences (the module's rule);
    ``rows`` holds the `COLUMNS`, one row per sentence and attack.

    Raises:
        DataError: If a column is missing (one line naming them).
    """
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise DataError(f"text examples: missing column(s) {', '.join(missing)}")
    head = (
        "<tr><th>attack</th><th>original</th><th>reconstruction</th><th>ROUGE-1</th>"
        "<th>ROUGE-2</th><th>exact</th><th>leaked</th></tr>"
    )
    parts = [
        _STYLE,
        '<section class="text-examples">',
        "<h2>Reconstructed sentences</h2>",
        f"<p>Marked: tokens of the reconstruction equal to the original's at the same place. "
        f"{html.escape(LEAK_RULE[0].upper() + LEAK_RULE[1:])}.</p>",
    ]
    if rows.empty:
        parts.append("<p>No text reconstructions.</p>")
    for defense in pd.unique(rows["defense"]):
        group = rows[rows["defense"] == defense]
        body = "".join(_row(r) for _, r in group.iterrows())
        parts.append(
            f"<h3>{html.escape(str(defense))}</h3>"
            f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"
        )
    parts.append("</section>")
    return "\n".join(parts)
