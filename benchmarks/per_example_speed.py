"""Per-example gradients (what DP-SGD clips) as the engine computes them, against the same
function compiled with XLA: is XLA the way to make DP-SGD's steps cheap (issue 66)?

`leakbench.components.per_example.per_example_losses_and_gradients` maps one example's gradient
over the batch with ``tf.vectorized_map``; TensorFlow has no vectorised form of a convolution's
kernel gradient, so that part runs as a loop over the examples. The same function compiled with
``jit_compile=True`` gives XLA the whole batch. For each (model, input shape) this prints the
mean wall time of one call on a batch of ``--batch`` random inputs (after a first call that
traces and compiles, whose time is printed too), both ways, and the largest difference between
their gradients. XLA compiles once per batch size, so a Poisson-sampled DP batch would need its
sizes padded to a few buckets; the figures here are for one fixed size.

Run from the repository root::

    PYTHONSAFEPATH=1 python benchmarks/per_example_speed.py
    PYTHONSAFEPATH=1 python benchmarks/per_example_speed.py --batch 32 --calls 20
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from leakbench.core.environment import describe_cpu, import_tensorflow_quietly

import_tensorflow_quietly()

import tensorflow as tf  # noqa: E402

from leakbench.components.models import build_model  # noqa: E402
from leakbench.components.per_example import per_example_losses_and_gradients  # noqa: E402

CASES = (
    ("lenet", (8, 8, 1), "digits"),
    ("lenet", (28, 28, 1), "MNIST"),
    ("lenet", (32, 32, 3), "CIFAR-10"),
    ("mlp", (8, 8, 1), "digits"),
    ("mlp", (32, 32, 3), "CIFAR-10"),
)


def _timed(function: Callable[..., Any], args: tuple[Any, ...], calls: int) -> tuple[float, float]:
    """The first call's seconds and the mean seconds of ``calls`` more."""
    start = time.perf_counter()
    function(*args)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        function(*args)
    return first, (time.perf_counter() - start) / calls


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="examples per call (default 128)")
    parser.add_argument("--calls", type=int, default=10, help="timed calls per way (default 10)")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.calls < 1:
        parser.error("--batch and --calls must be at least 1")
    print(f"{describe_cpu()['cpu']}; batch {args.batch}, mean of {args.calls} calls")
    print(f"{'model':6} {'input':>10} {'data':9} {'vectorised':>11} {'XLA':>9} {'ratio':>6} "
          f"{'XLA compile':>12} {'max diff':>9}")  # fmt: skip
    rng = np.random.default_rng(0)
    for name, shape, data in CASES:
        model = build_model(name, shape, 10, 0)
        x = tf.constant(rng.random((args.batch, *shape), np.float32))
        y = tf.one_hot(rng.integers(0, 10, args.batch), 10)

        def gradients(x: Any, y: Any, model: Any = model) -> Any:
            return per_example_losses_and_gradients(model, x, y)[1]

        plain, xla = tf.function(gradients), tf.function(gradients, jit_compile=True)
        _, plain_s = _timed(plain, (x, y), args.calls)
        compile_s, xla_s = _timed(xla, (x, y), args.calls)
        pairs = zip(plain(x, y), xla(x, y), strict=True)
        diff = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in pairs)
        size = "x".join(map(str, shape))
        print(f"{name:6} {size:>10} {data:9} {plain_s * 1e3:9.1f}ms {xla_s * 1e3:7.1f}ms "
              f"{plain_s / xla_s:5.1f}x {compile_s:10.2f} s {diff:9.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
