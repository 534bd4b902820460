"""Per-sentence scores of a text reconstruction: one-to-one matching, ROUGE, exact recovery and
token accuracy, and the rule that calls a sentence leaked.

**A row's sentence.** The ids of a row ``[L]`` (`leakbench.datasets.text_base`: ``<bos>``,
words, ``<eos>``, ``<pad>``...) up to and including its first ``<eos>``, or before its first
``<pad>``, whichever comes first; the whole row if it holds neither (a line cut at
``sequence_length``). What a reconstruction holds after its own end is not part of the sentence
it claims; the client's gradient carries nothing of the positions after the true sentence.

**ROUGE** is Google's ``rouge-score`` package (Lin, *ROUGE: A Package for Automatic Evaluation
of Summaries*, 2004), F-measures of ROUGE-1, ROUGE-2 and ROUGE-L, on the sentence's *words*:
its ids of 4 and up (the reserved ``<pad>``, ``<unk>``, ``<bos>``, ``<eos>`` are not words).
The package's default tokenizer lower-cases, drops every character that is not a letter or a
digit and splits on the rest, which would turn ``know't`` into ``know t`` and drop ``,`` and
``?``; our tokens are already cut by the corpus's rule (`leakbench.datasets.text_base.tokenize`)
and each is one vocabulary id. So the scorer gets the ids written as decimal words and a
tokenizer that splits on spaces (`IdTokenizer`): every vocabulary token, punctuation and
``know't`` included, counts as one token, exactly as the model and the attacks see it, and no
stemming merges two ids.

**Matching.** A gradient does not tell which row of the batch a reconstructed sentence came
from, so the reconstructions are assigned one-to-one to the true sentences (`match_sentences`,
the Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``) to maximise the total
ROUGE-L F, ties broken towards more tokens in place.

**Exact** recovery: the reconstruction's sentence equals the true one, id for id (its length
included). **Token accuracy**: the share of the true sentence's positions after its ``<bos>``
(which every row opens with, so it proves nothing) whose id the reconstruction's row holds in
the same place.

**Leaked** (`text_leaked`, `LEAK_RULE`): exact recovery, or ROUGE-2 F of at least
`ROUGE2_THRESHOLD` = 0.5. The threshold sits above what two *different* real sentences reach by
chance, measured once on the public pool by ``benchmarks/text_leak_threshold.py`` (Tiny
Shakespeare, a vocabulary of 2,000 words, ``sequence_length`` 32; 16 gives the same numbers, as
1.5% of the lines are longer than 14 tokens):

- 200,000 pairs of distinct public lines: ROUGE-2 F is 0 for the median pair, 0.100 at the
  99th percentile, 0.200 at the 99.9th; 0.003% reach 0.5;
- the best of B other random public lines (5,000 draws each), what a matching that may pick the
  luckiest of a batch reaches: 99th percentile 0.143 (B = 4), 0.182 (B = 8), 0.250 (B = 32);
  99.9th percentile 0.267, 0.364, 0.500; 0%, 0% and 0.12% reach 0.5.

So 0.5 is twice the 99th percentile of the most generous null (best of 32), which reaches it in
about one draw in a thousand. A reconstruction that shares half its
bigrams with a private sentence is not a chance resemblance of real text.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from leakbench.datasets.text_base import EOS, PAD

# Ids below this are the reserved tokens (`leakbench.datasets.text_base.RESERVED`).
FIRST_WORD = 4

ROUGE2_THRESHOLD = 0.5
LEAK_RULE = (
    f"a sentence leaked if its reconstruction is exact or reaches ROUGE-2 F >= "
    f"{ROUGE2_THRESHOLD} (the best of 32 unrelated public lines reaches it in 0.12% of draws)"
)


class IdTokenizer:
    """``rouge-score``'s tokenizer for our ids written as decimal words (the scorer calls its
    ``tokenize``): a split on spaces, no lower-casing, punctuation removal or stemming; every
    id is one token."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


@functools.cache
def _scorer() -> Any:
    """The ROUGE scorer, built on first use: ``rouge_score`` imports NLTK, seconds of import
    time that a run that scores no text (every image run imports this module) need not pay."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=IdTokenizer())


def sentence(row: np.ndarray) -> np.ndarray:
    """The ids of a row's sentence (the module's rule): through its first ``<eos>`` or before
    its first ``<pad>``, whichever comes first; the whole row if neither."""
    row = np.asarray(row)
    ends = np.flatnonzero((row == PAD) | (row == EOS))
    if ends.size == 0:
        return row
    end = int(ends[0])
    return row[: end + 1] if row[end] == EOS else row[:end]


def word_ids(row: np.ndarray) -> list[int]:
    """The words of a row's sentence: its ids of `FIRST_WORD` and up, in order."""
    return [int(i) for i in sentence(row) if i >= FIRST_WORD]


def rouge(true_row: np.ndarray, rec_row: np.ndarray) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F of one reconstruction against one true row, on words (0
    when either side has none)."""
    target = " ".join(map(str, word_ids(true_row)))
    prediction = " ".join(map(str, word_ids(rec_row)))
    scores = _scorer().score(target, prediction)
    return {name: float(score.fmeasure) for name, score in scores.items()}


def token_accuracy(true_row: np.ndarray, rec_row: np.ndarray) -> float:
    """Share of the true sentence's positions after ``<bos>`` that ``rec_row`` holds in place
    (NaN for a sentence of ``<bos>`` alone)."""
    truth = sentence(true_row)[1:]
    if truth.size == 0:
        return float("nan")
    rec = np.asarray(rec_row)[1 : 1 + truth.size]  # a shorter row holds fewer in place
    return float(np.sum(rec == truth[: rec.size]) / truth.size)


def exact(true_row: np.ndarray, rec_row: np.ndarray) -> bool:
    """Whether the reconstruction's sentence equals the true one, id for id."""
    return bool(np.array_equal(sentence(true_row), sentence(rec_row)))


def _check_rows(true_ids: np.ndarray, rec_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    true_ids, rec_ids = np.asarray(true_ids), np.asarray(rec_ids)
    if true_ids.ndim != 2 or rec_ids.ndim != 2:
        raise ValueError(
            f"ids must be [B, L] arrays, got {true_ids.shape} (true) and {rec_ids.shape} "
            "(reconstructed)"
        )
    if rec_ids.shape[0] < true_ids.shape[0]:
        raise ValueError(
            f"{rec_ids.shape[0]} reconstructed rows cannot match {true_ids.shape[0]} true ones"
        )
    return true_ids, rec_ids


def match_sentences(true_ids: np.ndarray, rec_ids: np.ndarray) -> np.ndarray:
    """For each true row of ``true_ids`` [B, L], the index of its reconstruction in ``rec_ids``
    [B', L'] (B' >= B): the one-to-one assignment of greatest total ROUGE-L F, ties broken
    towards more tokens in place (the module's rule).

    Raises:
        ValueError: If either is not 2-D or there are fewer reconstructions than true rows.
    """
    true_ids, rec_ids = _check_rows(true_ids, rec_ids)
    gain = np.zeros((len(true_ids), len(rec_ids)))
    for i, truth in enumerate(true_ids):
        for j, rec in enumerate(rec_ids):
            in_place = token_accuracy(truth, rec)
            gain[i, j] = rouge(truth, rec)["rougeL"] + 1e-6 * np.nan_to_num(in_place)
    rows, cols = linear_sum_assignment(gain, maximize=True)
    matched = np.empty(len(true_ids), np.int64)
    matched[rows] = cols
    return matched


def decode(row: np.ndarray, words: Sequence[str]) -> str:
    """A row's sentence as text: its words joined by spaces, the reserved tokens dropped."""
    return " ".join(words[i] for i in word_ids(row))


def score_text_batch(
    true_ids: np.ndarray, rec_ids: np.ndarray, words: Sequence[str]
) -> list[dict[str, object]]:
    """Per true sentence of a batch, in the batch's order, after `match_sentences`: ``rouge1``,
    ``rouge2``, ``rougeL`` (F), ``exact``, ``token_accuracy``, ``matched`` (the row of
    ``rec_ids`` it was matched to), ``text`` and ``reconstruction`` (`decode`d with ``words``,
    the vocabulary's word list, index = id), and ``leaked`` (`text_leaked`)."""
    true_ids, rec_ids = _check_rows(true_ids, rec_ids)
    matched = match_sentences(true_ids, rec_ids)
    rows: list[dict[str, object]] = []
    for truth, j in zip(true_ids, matched, strict=True):
        rec = rec_ids[int(j)]
        row: dict[str, object] = {
            **rouge(truth, rec),
            "exact": exact(truth, rec),
            "token_accuracy": token_accuracy(truth, rec),
            "matched": int(j),
            "text": decode(truth, words),
            "reconstruction": decode(rec, words),
        }
        row["leaked"] = text_leaked(row)
        rows.append(row)
    return rows


def text_leaked(scores: Mapping[str, object]) -> bool:
    """Whether a sentence leaked by `LEAK_RULE`, from its ``exact`` and ``rouge2`` scores."""
    return bool(scores["exact"]) or float(scores["rouge2"]) >= ROUGE2_THRESHOLD  # type: ignore[arg-type]
