"""Span recovery (`leakbench.attacks.text.span`) against batch size: exact-sentence share and time.

For both text models at initialisation (seed 0), widths d = 64 and 128, sequence length L = 16,
and batch sizes B (default 1, 2, 4, 8, 16), it attacks ``--batches`` consecutive private
batches of Tiny Shakespeare lines (the embedded corpus, a 500-word vocabulary from the public
pool; batch k holds private lines k*B .. k*B+B-1) with no defense and prints one row per
setting:

* ``B x (L-1)`` (the counted positions at most) against d;
* ``exact``: the share of sentences recovered exactly (every id equal, after matching found
  rows to true rows one to one, Hungarian on the share of equal ids);
* ``token_acc``: the share of ids equal in place over the matched rows;
* the stop reasons returned, and the mean wall time of one attack (one batch).

Run from the repository root (a few minutes on 2 cores)::

    python benchmarks/text_span.py
    python benchmarks/text_span.py --batch-sizes 1,4 --widths 64 --batches 2   # a quick look
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import tensorflow as tf
from scipy.optimize import linear_sum_assignment

from leakbench.attacks.text.base import TextTarget
from leakbench.attacks.text.span import SpanAttack
from leakbench.components.text_models import build_text_model
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.modalities.text import text_gradients

LENGTH = 16


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _score(found: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    agree = (found[:, None, :] == truth[None, :, :]).mean(axis=-1)
    rows, cols = linear_sum_assignment(-agree)
    return float(np.mean(agree[rows, cols] == 1.0)), float(np.mean(agree[rows, cols]))


def _setting(name: str, width: int, batch: int, batches: int, test: str) -> str:
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=500)
    model = build_text_model(name, len(vocab), LENGTH, seed=0, width=width)
    public = vocab.encode_many(corpus.public[:64], LENGTH)
    exact, tokens, seconds = [], [], []
    reasons: collections.Counter[str] = collections.Counter()
    for k in range(batches):
        ids = vocab.encode_many(corpus.private[k * batch : (k + 1) * batch], LENGTH)
        _, grads = text_gradients(model, ids)
        target = TextTarget(model, tuple(grads), batch, LENGTH, len(vocab), public)
        start = time.perf_counter()
        result = SpanAttack(test=test).run(target, tf.constant([0, k], tf.int64))
        seconds.append(time.perf_counter() - start)
        share, accuracy = _score(result.ids, ids)
        exact.append(share)
        tokens.append(accuracy)
        reasons[result.stop_reason] += 1
    stops = " ".join(f"{r}:{n}" for r, n in sorted(reasons.items()))
    return (
        f"| {name} | {width} | {batch} | {batch * (LENGTH - 1)} | {np.mean(exact):.2f} | "
        f"{np.mean(tokens):.2f} | {stops} | {np.mean(seconds):.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="transformer,gru")
    parser.add_argument("--widths", default="64,128")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--batches", type=int, default=3, help="private batches per setting")
    parser.add_argument("--test", default="exact", choices=("exact", "rank"))
    args = parser.parse_args()
    print(f"L = {LENGTH}, {args.batches} batch(es) per setting, test = {args.test}")
    print("| model | d | B | B x (L-1) | exact | token_acc | stop reasons | seconds / batch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        for width in _ints(args.widths):
            for batch in _ints(args.batch_sizes):
                print(_setting(name, width, batch, args.batches, args.test), flush=True)


if __name__ == "__main__":
    main()
