"""Learned inversion: an attack that adapts to any defense by learning through it.

Wu, Chen, Guo and Weinberger, "Learning to Invert: Simple Adaptive Attacks for Gradient
Inversion in Federated Learning", UAI 2023. The attacker takes public examples (the split the
private ones are not drawn from), computes for each batch of them the update a client would
share, through the client's own update code and the same defense with draws of its own
(`leakbench.attacks.Simulator`), and trains a network from that update (count-sketched to a
fixed size) to the batch (`leakbench.attacks.engine.inverter`). The network is then one forward
pass from an observed update to a reconstruction. It needs no knowledge of how the defense
works, so it is the adaptive attack of every defense, a plugin's included; it brings the data's
prior with it; and it never reads a private example.

The trained inverter is a pure function of the simulator's key and the attack's parameters. It
is kept in this process and, when the run gives a folder, in the run directory
(``inverters/<name>.npz``, with ``<name>.json``: its cost and held-out losses), written
atomically; an interrupted training continues from its last saved epoch
(``<name>.partial.npz``), and the same inverter is computed whether it was trained in one go,
resumed or read back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, RunOutput, Simulator
from leakbench.attacks.engine.inverter import (
    MAX_BATCH,
    Budget,
    CountSketch,
    Inverter,
    Progress,
    fit,
)
from leakbench.core.canonical import stable_hash
from leakbench.core.files import atomic_file, write_text
from leakbench.core.params import Int, Number, param

# Seconds between two saves of an inverter still training (its last epoch is always saved).
SAVE_SECONDS = 60.0


@ATTACKS.register("learned")
@dataclasses.dataclass(frozen=True)
class LearnedInversion(Attack):
    """Learned inversion (Wu et al., 2023): a network trained on public examples, through the
    defense, from the shared update to the batch; one forward pass per target.

    Batches of at most 4 examples (the network's loss takes the best of their orders). The
    labels come from the network, or from the target when the threat model gives them.
    """

    name = "learned"
    max_batch_size = MAX_BATCH
    # A defense's adaptive setting changes how a matching attack reads the update; this attack
    # already learns through the defense, so no setting applies to it.
    not_adaptive = ("retries", "pairs", "sketch", "hidden", "epochs", "lr", "batch")

    retries: int = param(0, Int(0, 100), doc="fresh starts after a non-finite answer (none: "
                         "the answer is deterministic)")  # fmt: skip
    pairs: int = param(4096, Int(16, 1_000_000), doc="training pairs (public batches, each "
                       "with a defense draw of its own)")  # fmt: skip
    sketch: int = param(4096, Int(16, 1 << 20), doc="count-sketch size of an update")
    hidden: int = param(1000, Int(8, 20_000), doc="width of the network's two hidden layers")
    epochs: int = param(100, Int(1, 10_000), doc="passes over the pairs")
    lr: float = param(1e-3, Number(0.0, 1.0, low_open=True), doc="Adam's learning rate")
    batch: int = param(128, Int(1, 65_536), doc="pairs per Adam step")

    def uses_simulator(self) -> bool:
        return True

    def budget(self) -> Budget:
        """How the network is trained."""
        return Budget(self.hidden, self.epochs, self.lr, self.batch)

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        del seed  # the answer is a forward pass: no random start
        simulator = target.simulator
        assert simulator is not None  # `Attack._check_target` refuses a target without one
        sketch = CountSketch(sum(int(np.prod(g.shape)) for g in target.gradients), self.sketch,
                             _SKETCH_SEED)  # fmt: skip
        inverter = self.inverter(target, sketch)
        images, labels = inverter.predict(sketch(target.gradients)[None])
        if target.labels is not None:
            labels = np.asarray(target.labels, np.int64)[None]
        history = inverter.history
        return RunOutput(
            images=images[0].reshape(target.batch_size, *target.input_shape),
            labels=labels[0],
            loss=float(np.nanmin(history)) if np.isfinite(history).any() else float("nan"),
            loss_history=history,
            evaluations=0,
            iterations_used=len(history),
        )

    def inverter(self, target: AttackTarget, sketch: CountSketch) -> Inverter:
        """The target's inverter: kept, read back from the simulator's folder, or trained."""
        simulator = target.simulator
        assert simulator is not None
        name = stable_hash([simulator.key, self.name, self.params(), list(target.input_shape),
                            target.batch_size, target.num_classes, sketch.size], 32)  # fmt: skip
        if name not in simulator.kept:
            store = _Store(simulator.folder, name)
            inverter = store.read()
            if inverter is None:
                inverter = self._train(target, sketch, store)
            simulator.kept[name] = inverter
        return simulator.kept[name]

    def _train(self, target: AttackTarget, sketch: CountSketch, store: _Store) -> Inverter:
        simulator = target.simulator
        assert simulator is not None
        start = time.perf_counter()
        features, images, labels = training_pairs(
            simulator, sketch, self.pairs, target.batch_size, seed=_PAIR_SEED
        )
        made = time.perf_counter() - start
        bar = tqdm(total=self.epochs, desc="learned: training the inverter", unit="epoch",
                   disable=not simulator.progress)  # fmt: skip
        resumed = store.progress()
        resumed_at = resumed.epoch if resumed else 0  # `fit` advances the state it is given
        bar.update(resumed_at)
        saver = store.saver(lambda: bar.update(1))
        with bar:
            inverter = fit(features, images, labels, target.num_classes, self.budget(),
                           _FIT_SEED, start=resumed, on_epoch=saver)  # fmt: skip
        store.write(inverter, {
            "pairs": self.pairs, "pair_seconds": round(made, 3),
            "fit_seconds": round(time.perf_counter() - start - made, 3),
            "resumed_at_epoch": resumed_at,
            "held_out_loss": [float(v) for v in inverter.history],
        })  # fmt: skip
        return inverter


# Fixed seeds of the attacker's own draws: which public batch is pair k, the sketch's hash and
# the network's start. They are the attacker's, not the run's: a run's seed picks the private
# examples and the model, and the simulator's key already holds both.
_PAIR_SEED, _SKETCH_SEED, _FIT_SEED = 0x1EA2, 0x5CE7, 0xF17


def training_pairs(
    simulator: Simulator, sketch: CountSketch, pairs: int, batch_size: int, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pairs`` training pairs: pair k is a batch of ``batch_size`` public examples (a seeded
    walk through the public split, every example once before any twice) and its shared update
    under defense draw k, sketched. Returns features [pairs, width], images [pairs, B, pixels]
    and labels [pairs, B]."""
    n = len(simulator.images)
    rng = np.random.default_rng(seed)
    walk = np.concatenate([rng.permutation(n) for _ in range(-(-pairs * batch_size // n))])
    features = np.empty((pairs, sketch.width), np.float32)
    pixels = int(np.prod(simulator.images.shape[1:]))
    images = np.empty((pairs, batch_size, pixels), np.float32)
    labels = np.empty((pairs, batch_size), np.int64)
    bar = tqdm(total=pairs, desc="learned: pairs through the defense", unit="pair",
               disable=not simulator.progress)  # fmt: skip
    with bar:
        for k in range(pairs):
            idx = walk[k * batch_size : (k + 1) * batch_size]
            x, y = simulator.images[idx], simulator.labels[idx]
            features[k] = sketch(simulator.share(x, y, k))
            images[k] = x.reshape(batch_size, pixels)
            labels[k] = y
            bar.update(1)
    return features, images, labels


class _Store:
    """An inverter's files in a folder (nothing is kept when there is none)."""

    def __init__(self, folder: Path | None, name: str) -> None:
        self.folder, self.name = folder, name
        self._saved = time.monotonic()

    def _path(self, suffix: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{self.name}{suffix}"

    def read(self) -> Inverter | None:
        path = self._path(".npz")
        arrays = _load(path) if path is not None else None
        return Inverter.from_arrays(arrays) if arrays is not None else None

    def progress(self) -> Progress | None:
        path = self._path(".partial.npz")
        arrays = _load(path) if path is not None else None
        return Progress.from_arrays(arrays) if arrays is not None else None

    def saver(self, tick: Callable[[], None]) -> Callable[[Progress], None]:
        def save(state: Progress) -> None:
            tick()
            path = self._path(".partial.npz")
            if path is not None and time.monotonic() - self._saved >= SAVE_SECONDS:
                _write_npz(path, state.arrays())
                self._saved = time.monotonic()

        return save

    def write(self, inverter: Inverter, record: dict[str, Any]) -> None:
        path = self._path(".npz")
        if path is None:
            return
        _write_npz(path, inverter.arrays())
        write_text(path.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
        partial = self._path(".partial.npz")
        if partial is not None:
            partial.unlink(missing_ok=True)


def _load(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``path``, or None when it is absent or cannot be read (it is then
    trained again: a truncated file from a crash is not an answer)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, KeyError, EOFError):
        return None


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as handle:
        np.savez(handle, **cast(dict[str, Any], arrays))
