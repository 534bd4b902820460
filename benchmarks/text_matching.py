"""The matching attack on text (`tag`) on real private Tiny Shakespeare lines: a table.

Each row attacks ``--sequences`` private lines (the private pool's first ones, from
``--offset``) in batches of B with one model (seed 0, untrained, untied embeddings, a
``--words``-word vocabulary built from the public pool) at ``sequence_length`` 16, and reports
the mean over sequences of ROUGE-1 and ROUGE-2 F1 (unigram and bigram overlap of the words,
special ids left out, computed here: clipped counts, as Lin's ROUGE-N), the share of the 15
positions after ``<bos>`` whose id is right, the mean seconds per attack and the stop reasons.
The reconstructed rows are matched one to one to the private rows by ROUGE-1 (Hungarian
assignment): the attack does not know their order.

The published point of comparison is breaching's TAG figure (ROUGE-1 0.80, ROUGE-2 0.70 at
B = 1, 16 tokens, 1,000 iterations on a 3-layer transformer); docs/text.md says how the
settings differ.

    PYTHONSAFEPATH=1 python benchmarks/text_matching.py [--sequences 8] [--rows all]
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from scipy.optimize import linear_sum_assignment

from leakbench.attacks.text.base import TextTarget
from leakbench.attacks.text.matching import TAG
from leakbench.components.text_models import build_text_model
from leakbench.datasets.text_base import BOS, EOS, PAD, build_vocabulary, load_text_corpus
from leakbench.modalities.text import text_gradients

LENGTH = 16
# name -> (model, B, attack parameters)
ROWS: dict[str, tuple[str, int, dict[str, object]]] = {
    "transformer-b1": ("transformer", 1, {}),
    "transformer-b1-full": ("transformer", 1, {"restrict": "full"}),
    "transformer-b4": ("transformer", 4, {}),
    "transformer-b4-cosine": ("transformer", 4, {"loss": "cosine"}),
    "transformer-b4-lamp": (
        "transformer",
        4,
        {"loss": "cosine", "prior_weight": 0.01, "swaps": 200},
    ),
    "gru-b1": ("gru", 1, {}),
    "gru-b1-swaps": ("gru", 1, {"swaps": 200}),
    "gru-b4": ("gru", 4, {}),
}


def words(ids: Sequence[int]) -> list[int]:
    """The ids ROUGE counts: every id but the special ``<pad>``, ``<bos>`` and ``<eos>``."""
    return [int(i) for i in ids if int(i) not in (PAD, BOS, EOS)]


def rouge_n(candidate: Sequence[int], reference: Sequence[int], n: int) -> float:
    """ROUGE-N F1 of two id sequences (n-gram counts clipped by the other's); 0 when either
    has no n-gram."""

    def grams(seq: Sequence[int]) -> collections.Counter[tuple[int, ...]]:
        return collections.Counter(tuple(seq[i : i + n]) for i in range(len(seq) - n + 1))

    found, true = grams(words(candidate)), grams(words(reference))
    hits = sum((found & true).values())
    if not hits:
        return 0.0
    precision, recall = hits / sum(found.values()), hits / sum(true.values())
    return 2 * precision * recall / (precision + recall)


def matched(recovered: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``recovered``'s rows in the order of ``truth``'s, matched one to one by ROUGE-1."""
    score = np.array([[rouge_n(r, t, 1) for r in recovered] for t in truth])
    rows, cols = linear_sum_assignment(-score)
    return recovered[cols[np.argsort(rows)]]


def run_row(name: str, sequences: int, offset: int, words_kept: int) -> dict[str, object]:
    """One row of the table (the module docstring)."""
    model_name, batch, params = ROWS[name]
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=words_kept)
    public = vocab.encode_many(corpus.public, LENGTH)
    model = build_text_model(model_name, len(vocab), LENGTH, seed=0)
    attack = TAG(**params)  # type: ignore[arg-type]
    r1, r2, acc, seconds, reasons = [], [], [], [], collections.Counter()
    for start in range(offset, offset + sequences, batch):
        ids = vocab.encode_many(corpus.private[start : start + batch], LENGTH)
        _, gradients = text_gradients(model, ids)
        target = TextTarget(model, tuple(gradients), batch, LENGTH, len(vocab), public)
        began = time.perf_counter()
        result = attack.run(target, tf.constant([0, start], tf.int64))
        seconds.append(time.perf_counter() - began)
        reasons[result.stop_reason] += 1
        found = matched(result.ids, ids)
        r1 += [rouge_n(f, t, 1) for f, t in zip(found, ids, strict=True)]
        r2 += [rouge_n(f, t, 2) for f, t in zip(found, ids, strict=True)]
        acc.append(float(np.mean(found[:, 1:] == ids[:, 1:])))
    return {
        "row": name,
        "B": batch,
        "rouge1": float(np.mean(r1)),
        "rouge2": float(np.mean(r2)),
        "token_accuracy": float(np.mean(acc)),
        "seconds": float(np.mean(seconds)),
        "stops": " ".join(f"{k}:{v}" for k, v in sorted(reasons.items())),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=8, help="private lines per row")
    parser.add_argument("--offset", type=int, default=10, help="first private line")
    parser.add_argument("--words", type=int, default=2000, help="vocabulary words")
    parser.add_argument("--rows", default="all", help="comma-separated rows, or all")
    args = parser.parse_args(argv)
    names = list(ROWS) if args.rows == "all" else args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; one of {', '.join(ROWS)}")
    header = f"{'row':24} {'B':>2} {'ROUGE-1':>8} {'ROUGE-2':>8} {'tok.acc':>8} {'s/attack':>9}"
    print(header + "  stops", flush=True)
    for name in names:
        row = run_row(name, args.sequences, args.offset, args.words)
        print(
            f"{row['row']:24} {row['B']:>2} {row['rouge1']:8.3f} {row['rouge2']:8.3f} "
            f"{row['token_accuracy']:8.3f} {row['seconds']:9.1f}  {row['stops']}",
            flush=True,
        )
    print("breaching's TAG (B=1, 16 tokens, 1000 it., 3-layer transformer): R-1 0.80, R-2 0.70")


if __name__ == "__main__":
    main()
