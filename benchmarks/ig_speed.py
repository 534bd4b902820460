"""Time per iteration of Inverting Gradients: leakbench's `ig` against a PyTorch implementation.

For `convnet` (width 8), `convnet64` (the paper's width 64) and `resnet18` (the CIFAR ResNet-18),
both on one 32x32x3 image with 10 classes and BatchNorm in training mode (batch statistics, as
both frameworks train), it times one
iteration of the Inverting Gradients loop: the parameter gradient of the dummy image, one minus
its cosine similarity with the observed gradient plus total variation, the gradient of that
with respect to the image, a signed Adam step and the clamp to [0, 1].

- leakbench: `make_attack("ig", iterations=k)` with labels known, each budget run twice and the
  second (compiled) call timed; the time per iteration is the difference between budgets of 110
  and 10 iterations divided by 100, so compilation and the per-call overhead drop out.
- PyTorch: the same architecture (random weights: the time does not depend on them) and the
  same loop written with ``torch.autograd.grad(create_graph=True)``, 5 warm-up iterations, then
  50 timed, with 1 thread and with as many as the machine has.

    PYTHONSAFEPATH=1 python benchmarks/ig_speed.py --csv results/perf/ig_speed.csv

PyTorch is not a dependency of leakbench: install it for this script only
(``pip install torch``); without it only the leakbench rows are written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.environment import script_command, write_run_record

SHAPE, CLASSES = (32, 32, 3), 10
MODELS = ("convnet", "convnet64", "resnet18")


def leakbench_ms(name: str, low: int = 10, high: int = 110) -> float:
    model = build_model(name, SHAPE, CLASSES, seed=0)
    x = tf.constant(np.random.default_rng(0).uniform(size=(1, *SHAPE)), tf.float32)
    y = np.array([3])
    grads = model_gradients(model, x, tf.one_hot(y, CLASSES))
    target = AttackTarget(model, tuple(grads), SHAPE, 1, CLASSES, labels=y)
    times = {}
    for iterations in (low, high):
        attack = make_attack("ig", iterations=iterations)
        attack(target, seed=0)  # compiles
        start = time.perf_counter()
        attack(target, seed=1)
        times[iterations] = time.perf_counter() - start
    return 1000 * (times[high] - times[low]) / (high - low)


def torch_model(name: str):  # noqa: ANN201 (torch is optional)
    import torch
    from torch import nn

    def bn_relu(channels: int) -> list:
        return [nn.BatchNorm2d(channels), nn.ReLU()]

    if name.startswith("convnet"):
        width = 64 if name == "convnet64" else 8
        layers, channels = [], 3
        for index, multiple in enumerate((1, 2, 2, 4, 4, 4, 4, 4)):
            layers += [nn.Conv2d(channels, multiple * width, 3, padding=1)]
            layers += bn_relu(multiple * width)
            channels = multiple * width
            if index in (5, 7):
                layers.append(nn.MaxPool2d(3))
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * 9, CLASSES))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Sequential()
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):  # noqa: ANN001, ANN202
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.short(x))

    blocks, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 1, 1, bias=False), *bn_relu(64), *blocks,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES),
    )  # fmt: skip


def torch_ms(name: str, threads: int, warmup: int = 5, timed: int = 50) -> float:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_model(name).train()  # BatchNorm with batch statistics, as leakbench's
    params = [p for p in model.parameters() if p.requires_grad]
    x = torch.rand(1, 3, 32, 32)
    y = torch.tensor([3])
    loss = torch.nn.CrossEntropyLoss()
    observed = [g.detach() for g in torch.autograd.grad(loss(model(x), y), params)]
    dummy = torch.rand(1, 3, 32, 32, requires_grad=True)
    optimizer = torch.optim.Adam([dummy], lr=0.1)

    def iteration() -> None:
        optimizer.zero_grad()
        grads = torch.autograd.grad(loss(model(dummy), y), params, create_graph=True)
        dot = sum((g * o).sum() for g, o in zip(grads, observed, strict=True))
        norm = torch.sqrt(sum((g * g).sum() for g in grads)) * torch.sqrt(
            sum((o * o).sum() for o in observed)
        )
        tv = (dummy[:, :, 1:] - dummy[:, :, :-1]).abs().mean() + (
            dummy[:, :, :, 1:] - dummy[:, :, :, :-1]
        ).abs().mean()
        (1 - dot / norm + 1e-4 * tv).backward()
        dummy.grad.sign_()
        optimizer.step()
        with torch.no_grad():
            dummy.clamp_(0, 1)

    for _ in range(warmup):
        iteration()
    start = time.perf_counter()
    for _ in range(timed):
        iteration()
    return 1000 * (time.perf_counter() - start) / timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=Path("results/perf/ig_speed.csv"))
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        have_torch = False
    else:
        have_torch = True
    cores = os.cpu_count() or 1
    rows = []
    for name in args.models.split(","):
        params = sum(int(np.prod(v.shape)) for v in build_model(name, SHAPE, CLASSES, 0).weights
                     if v.trainable)  # fmt: skip
        rows.append({"model": name, "parameters": params, "implementation": "leakbench",
                     "threads": cores, "ms_per_iteration": leakbench_ms(name)})  # fmt: skip
        if have_torch:
            for threads in sorted({1, cores}):
                ms = torch_ms(name, threads)
                rows.append({"model": name, "parameters": params, "implementation": "pytorch",
                             "threads": threads, "ms_per_iteration": ms})  # fmt: skip
        frame = pd.DataFrame(rows)
        print(frame.tail(3).to_string(index=False), flush=True)
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.csv, index=False)
    write_run_record(args.csv.parent, args.csv.name, script_command(__file__, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
