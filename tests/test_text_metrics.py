"""Per-sentence text scores (`leakbench.components.text_metrics`): hand-counted ROUGE, exact
recovery, token accuracy, the one-to-one matching and the leak rule, on toy rows and on real
Tiny Shakespeare lines."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from leakbench.components.text_metrics import (
    LEAK_RULE,
    ROUGE2_THRESHOLD,
    match_sentences,
    rouge,
    score_text_batch,
    sentence,
    text_leaked,
)
from leakbench.datasets.text_base import RESERVED, build_vocabulary, load_text_corpus

# ids 4..10: the cat sat on mat , know't
WORDS = (*RESERVED, "the", "cat", "sat", "on", "mat", ",", "know't")


def test_rouge_token_accuracy_and_exact_by_hand() -> None:
    true = np.array([[2, 4, 5, 6, 3, 0, 0]])  # the cat sat
    rec = np.array([[2, 4, 5, 7, 3, 0, 0]])  # the cat on
    (row,) = score_text_batch(true, rec, WORDS)
    # unigrams: 2 of 3 shared; bigrams: (the cat) of 2; LCS: "the cat", 2 of 3.
    assert row["rouge1"] == pytest.approx(2 / 3)
    assert row["rouge2"] == pytest.approx(1 / 2)
    assert row["rougeL"] == pytest.approx(2 / 3)
    # positions after <bos>: the cat sat <eos> against the cat on <eos>
    assert row["token_accuracy"] == pytest.approx(3 / 4)
    assert row["exact"] is False
    assert row["matched"] == 0
    assert row["text"] == "the cat sat"
    assert row["reconstruction"] == "the cat on"
    assert row["leaked"] is True  # ROUGE-2 F 0.5 reaches the threshold
    assert ROUGE2_THRESHOLD == 0.5 and "ROUGE-2" in LEAK_RULE


def test_punctuation_and_apostrophes_are_tokens() -> None:
    # know't , cat  against  know't cat: the comma and know't are one token each.
    scores = rouge(np.array([2, 10, 9, 5, 3]), np.array([2, 10, 5, 3]))
    assert scores["rouge1"] == pytest.approx(2 * 1.0 * (2 / 3) / (1.0 + 2 / 3))  # P 1, R 2/3
    assert scores["rouge2"] == pytest.approx(0.0)  # (know't ,) (, cat) vs (know't cat)
    (row,) = score_text_batch(np.array([[2, 10, 9, 5, 3]]), np.array([[2, 10, 5, 3, 0]]), WORDS)
    assert row["text"] == "know't , cat"


def test_reserved_ids_are_not_words() -> None:
    # <unk> is dropped from ROUGE, so the words agree, but the ids do not.
    true, rec = np.array([[2, 4, 1, 5, 3]]), np.array([[2, 4, 5, 3, 0]])
    (row,) = score_text_batch(true, rec, WORDS)
    assert row["rouge1"] == row["rouge2"] == row["rougeL"] == pytest.approx(1.0)
    assert row["exact"] is False
    assert row["token_accuracy"] == pytest.approx(1 / 4)  # only position 1 (the) in place
    assert row["text"] == "the cat"


def test_a_sentence_ends_at_its_eos_or_first_pad() -> None:
    np.testing.assert_array_equal(sentence(np.array([2, 4, 3, 9, 9])), [2, 4, 3])
    np.testing.assert_array_equal(sentence(np.array([2, 4, 0, 9])), [2, 4])
    np.testing.assert_array_equal(sentence(np.array([2, 4, 5])), [2, 4, 5])  # cut at L
    true = np.array([[2, 4, 5, 3, 0, 0]])
    after_end = score_text_batch(true, np.array([[2, 4, 5, 3, 9, 9]]), WORDS)[0]
    assert after_end["exact"] is True and after_end["reconstruction"] == "the cat"
    no_eos = score_text_batch(true, np.array([[2, 4, 5, 0, 0, 0]]), WORDS)[0]
    assert no_eos["exact"] is False and no_eos["rouge2"] == pytest.approx(1.0)
    assert no_eos["token_accuracy"] == pytest.approx(2 / 3)
    # Rows of another length: a shorter reconstruction holds fewer positions.
    short = score_text_batch(true, np.array([[2, 4, 6]]), WORDS)[0]
    assert short["token_accuracy"] == pytest.approx(1 / 3) and short["exact"] is False


def test_matching_undoes_a_permutation_and_allows_spare_rows() -> None:
    true = np.array([[2, 4, 5, 3], [2, 7, 8, 3], [2, 6, 9, 3]])
    rec = true[[2, 0, 1]]
    np.testing.assert_array_equal(match_sentences(true, rec), [1, 2, 0])
    spare = np.concatenate([np.array([[2, 10, 10, 3]]), rec])
    np.testing.assert_array_equal(match_sentences(true, spare), [2, 3, 1])
    rows = score_text_batch(true, rec, WORDS)
    assert [r["exact"] for r in rows] == [True, True, True]
    with pytest.raises(ValueError, match="cannot match"):
        match_sentences(true, rec[:2])


def test_matching_maximises_the_total_not_each_row_greedily() -> None:
    # ROUGE-L F: row 0 (4 5 6 7) vs rec 0 (4 5 6 7 8): 8/9; vs rec 1 (4 5 6): 6/7.
    # row 1 (8 9) vs rec 0: LCS 1 of 2 and 5, 2/7; vs rec 1: 0. Greedy on row 0 takes rec 0
    # (total 8/9); the assignment takes 6/7 + 2/7 = 8/7.
    true = np.array([[2, 4, 5, 6, 7, 3, 0], [2, 8, 9, 3, 0, 0, 0]])
    rec = np.array([[2, 4, 5, 6, 7, 8, 3], [2, 4, 5, 6, 3, 0, 0]])
    assert rouge(true[0], rec[0])["rougeL"] == pytest.approx(8 / 9)
    assert rouge(true[0], rec[1])["rougeL"] == pytest.approx(6 / 7)
    assert rouge(true[1], rec[0])["rougeL"] == pytest.approx(2 / 7)
    np.testing.assert_array_equal(match_sentences(true, rec), [1, 0])


def test_the_leak_rule() -> None:
    assert text_leaked({"exact": True, "rouge2": 0.0})
    assert text_leaked({"exact": False, "rouge2": ROUGE2_THRESHOLD})
    assert not text_leaked({"exact": False, "rouge2": np.nextafter(ROUGE2_THRESHOLD, 0.0)})


@functools.lru_cache(maxsize=1)
def _private_rows() -> tuple[np.ndarray, tuple[str, ...]]:
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=2000)
    return vocab.encode_many(corpus.private[:64], 24), vocab.words


def test_real_lines_permuted_are_recovered_and_unrelated_ones_are_not() -> None:
    rows, words = _private_rows()
    true = rows[:8]
    order = np.random.default_rng(0).permutation(8)
    scores = score_text_batch(true, true[order], words)
    np.testing.assert_array_equal([s["matched"] for s in scores], np.argsort(order))
    assert all(s["exact"] and s["leaked"] and s["token_accuracy"] == 1.0 for s in scores)
    assert all(s["rouge1"] == s["rougeL"] == 1.0 for s in scores)
    # Other private lines, not a reconstruction of these: below the leak line.
    others = score_text_batch(true, rows[32:40], words)
    assert not any(s["leaked"] for s in others)
    assert max(float(s["rouge2"]) for s in others) < ROUGE2_THRESHOLD


def test_one_dropped_word_of_a_real_line() -> None:
    rows, words = _private_rows()
    # A line of 6 to 18 known, distinct words (no <unk>, no repeat), not cut at L.
    truth = next(
        r
        for r in rows
        if 8 <= len(sentence(r)) <= 20
        and all(i >= 4 for i in sentence(r)[1:-1])
        and len(set(sentence(r))) == len(sentence(r))
    )
    n = len(sentence(truth)) - 2
    dropped = np.concatenate([truth[:3], truth[4:], [0]])  # the third word gone
    (row,) = score_text_batch(truth[None], dropped[None], words)
    # n words against n - 1, all in order
    assert row["rouge1"] == pytest.approx(2 * (n - 1) / (2 * n - 1))
    assert row["rougeL"] == pytest.approx(2 * (n - 1) / (2 * n - 1))
    # bigrams: n - 1 against n - 2, of which n - 3 are kept (the two around the word go)
    assert row["rouge2"] == pytest.approx(2 * (n - 3) / (2 * n - 3))
    # n words and <eos> after <bos>; only the first two words stay in place
    assert row["token_accuracy"] == pytest.approx(2 / (n + 1))
    assert row["exact"] is False
