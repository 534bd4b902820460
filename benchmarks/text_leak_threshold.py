"""Calibrates the text leak rule's ROUGE-2 threshold on a null: what two *different* real
sentences score against each other by chance.

Run from the repository root:

    PYTHONSAFEPATH=1 python benchmarks/text_leak_threshold.py [--sequence-length 32]

Two nulls, both on the public pool of the corpus (never the private one), encoded as the clients'
rows are (`leakbench.datasets.text_base`), scored by `leakbench.components.text_metrics.rouge`:

- **pairs**: random pairs of public lines whose sentences differ (a line that repeats another
  word for word is the same sentence, not a chance match), the quantiles of their ROUGE-2 F;
- **best of B**: a public line against B other random public lines whose sentences differ from
  it, the best ROUGE-2 F among them: what a matched reconstruction that is some unrelated real
  line reaches, when the matching may pick the luckiest of B.

It prints the quantiles and the share of each null at or above the module's threshold
(`ROUGE2_THRESHOLD`), which must sit above the 99th percentile of every null.
"""

from __future__ import annotations

import argparse

import numpy as np

from leakbench.components.text_metrics import ROUGE2_THRESHOLD, rouge, sentence
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus

QUANTILES = (0.5, 0.9, 0.99, 0.999)


def differ(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two rows hold different sentences."""
    return not np.array_equal(sentence(a), sentence(b))


def pair_null(rows: np.ndarray, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """ROUGE-2 F of ``pairs`` random pairs of rows holding different sentences."""
    scores = []
    while len(scores) < pairs:
        i, j = rng.choice(len(rows), 2, replace=False)
        if differ(rows[i], rows[j]):
            scores.append(rouge(rows[i], rows[j])["rouge2"])
    return np.array(scores)


def best_of_null(rows: np.ndarray, b: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """Per trial, the best ROUGE-2 F of a random row among ``b`` other random rows holding
    sentences different from it."""
    best = []
    for _ in range(trials):
        i = int(rng.integers(len(rows)))
        others = [j for j in rng.permutation(len(rows))[: 4 * b] if differ(rows[i], rows[j])][:b]
        best.append(max(rouge(rows[i], rows[j])["rouge2"] for j in others))
    return np.array(best)


def describe(name: str, scores: np.ndarray) -> None:
    """Prints a null's quantiles and its share at or above the threshold."""
    cuts = ", ".join(f"q{q:g} {np.quantile(scores, q):.3f}" for q in QUANTILES)
    above = float(np.mean(scores >= ROUGE2_THRESHOLD))
    print(f"{name:14s} n={len(scores):6d}  {cuts}  share >= {ROUGE2_THRESHOLD}: {above:.4%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="tinyshakespeare")
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--max-words", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    corpus = load_text_corpus(args.corpus)
    vocab = build_vocabulary(corpus, args.max_words)
    rows = vocab.encode_many(corpus.public, args.sequence_length)
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.corpus}: {len(rows)} public lines, {len(vocab)} ids, sequence_length "
        f"{args.sequence_length}; threshold {ROUGE2_THRESHOLD}"
    )
    describe("pairs", pair_null(rows, args.pairs, rng))
    for b in (4, 8, 32):
        describe(f"best of {b}", best_of_null(rows, b, args.trials, rng))


if __name__ == "__main__":
    main()
