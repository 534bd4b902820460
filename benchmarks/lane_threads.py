"""Lanes and threads on a CPU: how fast L-BFGS attacks on the LFW LeNet run per thread layout.

The runner's CPU plan (`leakbench.attacks.engine.lanes.default_plan`) runs each trial in a
width-1 program and one lane per core, on the measurement that one compiled call keeps about
one core busy on the CIFAR-10 LeNet (`benchmarks/attack_speed.py`). The LFW LeNet's head has
5,749 classes (4.4 million weights), and a call there may use more than one core by itself.
This script times ``dlg`` on ``--images`` LFW test images (LeNet at its seed-0
initialisation, no defense) for one layout: ``--lanes`` threads of width-1 programs and
TensorFlow's intra-op pool of ``--intra`` threads (0: TensorFlow's default, one per core).
Every problem runs exactly ``--iterations`` iterations (the stall and convergence tests are
off), so the layouts do the same work; the numbers of each problem do not depend on the lanes
(width-1 programs), and only the intra-op pool can move their last bits.

It prints one line: iterations, wall and process CPU seconds, and iterations per second. Run
each layout in its own process (the intra-op pool is fixed at start-up), from the project
root, where ``../shared/data/lfw`` holds the LFW arrays::

    python benchmarks/lane_threads.py --lanes 2
    python benchmarks/lane_threads.py --lanes 1
    python benchmarks/lane_threads.py --lanes 2 --intra 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

LFW = Path("../shared/data/lfw/lfw-deepfunneled-32.npz")
CLASSES = 5749


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4, help="problems timed (>= 1)")
    parser.add_argument("--iterations", type=int, default=200, help="iterations each (>= 1)")
    parser.add_argument("--lanes", type=int, default=2, help="threads of width-1 programs")
    parser.add_argument("--intra", type=int, default=0, help="intra-op threads (0: default)")
    parser.add_argument("--data", type=Path, default=LFW, help="the LFW 32x32 arrays")
    args = parser.parse_args(argv)
    for flag, value, low in (("--images", args.images, 1), ("--iterations", args.iterations, 1),
                             ("--lanes", args.lanes, 1), ("--intra", args.intra, 0)):  # fmt: skip
        if value < low:
            parser.error(f"{flag} must be an integer of at least {low}, got {value}")
    if not args.data.is_file():
        parser.error(f"--data: no file {args.data} (the LFW arrays of ../shared/data)")
    # TensorFlow is imported once the arguments are known good: its intra-op pool is set
    # before anything runs, and a usage error costs no start-up.
    import tensorflow as tf

    if args.intra:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)

    from leakbench.attacks import AttackTarget, make_attack
    from leakbench.attacks.engine import lanes
    from leakbench.components.forward import model_gradients
    from leakbench.components.models import build_model

    with np.load(args.data) as held:
        x = held["x_test"][: args.images].astype(np.float32) / 255.0
        y = held["y_test"][: args.images]
    model = build_model("lenet", x.shape[1:], CLASSES, 0)
    targets = []
    for i in range(len(x)):
        grads = model_gradients(model, tf.constant(x[i : i + 1]), tf.one_hot(y[i : i + 1], CLASSES))
        targets.append(AttackTarget(model, tuple(grads), x.shape[1:], 1, CLASSES))
    plan = lanes.Plan(slots=1, threads=args.lanes, tail=0)
    lanes.default_plan = lambda width: plan  # this process only
    attack = make_attack("dlg", iterations=args.iterations, stall_window=0, loss_tolerance=0.0)
    attack.attack_many(targets[:1], [0])  # traces and compiles the program, untimed
    wall, cpu = time.perf_counter(), time.process_time()
    outs = attack.attack_many(targets, list(range(1, len(targets) + 1)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = sum(o.iterations_used for o in outs)
    print(f"lanes {args.lanes}, intra-op {args.intra or 'default'}, {len(targets)} problems: "
          f"{done} iterations in {wall:.1f} s wall, {cpu:.1f} s CPU, "
          f"{done / wall:.1f} iterations/s ({os.cpu_count()} CPUs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
