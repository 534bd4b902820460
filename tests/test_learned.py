"""The learned attack (`leakbench.attacks.learned`) and its inverter (`attacks.engine.inverter`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, Simulator, make_attack
from leakbench.attacks.engine.inverter import Budget, CountSketch, Inverter, Progress, fit
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import observed_draw, simulation_seed
from leakbench.datasets import load_dataset
from leakbench.run.config import parse_config
from leakbench.run.runner import run_benchmark

SCRAMBLE = Path(__file__).parents[1] / "results" / "learned" / "scramble.py"


def test_the_sketch_adds_each_coordinate_with_its_sign_into_its_bucket() -> None:
    sketch = CountSketch(size=7, dim=3, seed=5)
    update = [tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([5.0, 6.0, 7.0])]
    buckets, signs = (t.numpy() for t in sketch._hash())
    flat = np.arange(1.0, 8.0)
    by_hand = np.zeros(3)
    for value, bucket, sign in zip(flat, buckets, signs, strict=True):
        by_hand[bucket] += sign * value
    np.testing.assert_allclose(sketch(update), by_hand, rtol=1e-6)
    assert set(np.unique(signs)) <= {-1.0, 1.0} and buckets.max() < 3
    # Linear, as a sketch of a sum must be.
    twice = [2 * u for u in update]
    np.testing.assert_allclose(sketch(twice), 2 * sketch(update), rtol=1e-6)


def test_a_small_update_is_kept_whole_and_a_wrong_size_is_refused() -> None:
    sketch = CountSketch(size=3, dim=8, seed=0)
    np.testing.assert_array_equal(sketch([tf.constant([1.0, -2.0, 3.0])]), [1.0, -2.0, 3.0])
    assert sketch.width == 3
    with pytest.raises(ValueError, match="2 values; the sketch takes 3"):
        sketch([tf.constant([1.0, 2.0])])


def _linear_pairs(n: int, batch: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.uniform(0.1, 0.9, (n, batch, 6)).astype(np.float32)
    labels = (images[..., 0] > 0.5).astype(np.int64)
    mixing = rng.normal(size=(batch * 6, 10)).astype(np.float32)
    return images.reshape(n, -1) @ mixing, images, labels


BUDGET = Budget(hidden=32, epochs=6, lr=3e-3, batch=32)


def test_fit_learns_an_invertible_map_and_is_deterministic() -> None:
    features, images, labels = _linear_pairs(400)
    first = fit(features, images, labels, 2, BUDGET, seed=1)
    second = fit(features, images, labels, 2, BUDGET, seed=1)
    for a, b in zip(first.weights, second.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert first.history[-1] < 0.5 * first.history[0]
    predicted, _ = first.predict(features[:50])
    assert np.all((predicted >= 0) & (predicted <= 1))
    # Better than the mean image: it read the features.
    baseline = np.mean((images[:50] - images.mean(axis=0)) ** 2)
    assert np.mean((predicted - images[:50]) ** 2) < 0.5 * baseline


def test_a_resumed_fit_returns_the_uninterrupted_one() -> None:
    features, images, labels = _linear_pairs(200)
    whole = fit(features, images, labels, 2, BUDGET, seed=3)
    saved: list[dict[str, np.ndarray]] = []

    def stop_after_two(state: Progress) -> None:
        saved.append(state.arrays())
        if state.epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(features, images, labels, 2, BUDGET, seed=3, on_epoch=stop_after_two)
    start = Progress.from_arrays(saved[-1])
    resumed = fit(features, images, labels, 2, BUDGET, seed=3, start=start)
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.history, resumed.history)
    back = Inverter.from_arrays(whole.arrays())
    np.testing.assert_array_equal(back.predict(features)[0], whole.predict(features)[0])


def test_a_batch_is_scored_in_its_best_order() -> None:
    # Two examples whose order carries nothing the features tell: the loss must not care.
    features, images, labels = _linear_pairs(300, batch=2)
    swapped = images[:, ::-1].copy()
    a = fit(features, images, labels[:, :], 2, BUDGET, seed=0)
    b = fit(features, swapped, labels[:, ::-1].copy(), 2, BUDGET, seed=0)
    np.testing.assert_allclose(a.history, b.history, rtol=1e-5)
    with pytest.raises(ValueError, match="at most 4"):
        fit(np.zeros((4, 3), np.float32), np.zeros((4, 5, 2), np.float32),
            np.zeros((4, 5), np.int64), 2, BUDGET, seed=0)  # fmt: skip


def test_the_attackers_draws_never_share_a_key_with_a_private_batch() -> None:
    private = {tuple(observed_draw(seed, b).numpy()) for seed in range(3) for b in range(50)}
    own = {tuple(observed_draw(simulation_seed(seed), d).numpy()) for seed in range(3)
           for d in range(50)}  # fmt: skip
    assert not private & own


def test_a_target_without_a_simulator_is_refused_in_one_line() -> None:
    import keras

    model = keras.Sequential(
        [keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    grads = tuple(tf.zeros_like(v) for v in model.trainable_variables)
    target = AttackTarget(model, grads, (2, 2, 1), 1, 2)
    with pytest.raises(ConfigError, match="needs a simulator"):
        make_attack("learned", pairs=16, epochs=1, hidden=8)(target, seed=0)


SMALL = """
name = "learned-small"
dataset = "{dataset}"
model = "lenet"
images = 4
seeds = [0]
suite = "listed"
plugins = ["{plugin}"]

[[attack]]
name = "learned"
pairs = 600
hidden = 128
epochs = 25
sketch = 2048

[[attack]]
name = "idlg"
iterations = 200

[[defense]]
name = "none"

[[defense]]
name = "scramble"

[training]
enabled = false
"""


def _run(tmp_path: Path, dataset: str, name: str, workers: int = 1) -> Path:
    spec = parse_config(SMALL.format(dataset=dataset, plugin=SCRAMBLE))
    out = tmp_path / name
    run_benchmark(spec, out, progress=False, workers=workers)
    return out


def test_the_learned_attack_sees_through_a_scramble_that_stops_idlg(tmp_path: Path) -> None:
    # In two worker processes, which keep their inverters in the run directory too.
    out = _run(tmp_path, "digits", "run", workers=2)
    trials = pd.read_csv(out / "trials.csv")
    psnr = trials.groupby(["defense", "attack"])["psnr"].median()
    # Through the secret permutation the model's own gradient matches nothing ...
    # (measured: 3.9 dB, against 100 dB without the defense) ...
    assert psnr["scramble", "idlg"] < 8
    # ... while the network learned through it does about as well as without it (13.9 and
    # 14.7 dB on this small budget; the mean image of the public split gives about 11).
    assert psnr["scramble", "learned"] > 12
    assert abs(psnr["scramble", "learned"] - psnr["none", "learned"]) < 3
    records = sorted((out / "inverters").glob("*.json"))
    assert len(records) == 2  # one inverter per defense configuration
    record = json.loads(records[0].read_text())
    assert record["pairs"] == 600 and len(record["held_out_loss"]) == 25


def test_the_inverter_never_reads_a_private_example(tmp_path: Path) -> None:
    digits = load_dataset("digits")
    clean, poisoned = tmp_path / "clean.npz", tmp_path / "poisoned.npz"
    arrays = {"x": digits.train.x, "y": digits.train.y,
              "x_test": digits.test.x, "y_test": digits.test.y}  # fmt: skip
    np.savez(clean, **arrays)
    noise = np.random.default_rng(0).uniform(size=digits.test.x.shape).astype(np.float32)
    np.savez(poisoned, **{**arrays, "x_test": noise, "y_test": digits.test.y[::-1].copy()})
    inverters = []
    for name, path in (("clean", clean), ("poisoned", poisoned)):
        out = _run(tmp_path, f"npz:{path}", name)
        files = sorted((out / "inverters").glob("*.npz"))
        inverters.append([dict(np.load(f)) for f in files])
    # The private split (test) differs; each inverter (one per defense) is the same, array for
    # array (their file names differ: the dataset's path is part of what names them).
    assert len(inverters[0]) == len(inverters[1]) == 2

    def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    for clean_inverter in inverters[0]:
        assert sum(same(clean_inverter, other) for other in inverters[1]) == 1


def test_a_simulator_keeps_what_it_trained() -> None:
    calls = []

    def share(x: np.ndarray, y: np.ndarray, draw: int) -> tuple[tf.Tensor, ...]:
        calls.append(draw)
        return (tf.constant(x.reshape(-1)),)

    images = np.random.default_rng(0).uniform(size=(40, 2, 2, 1)).astype(np.float32)
    simulator = Simulator(images, np.arange(40) % 2, share, "key")
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
    target = AttackTarget(model, (tf.constant(images[0].reshape(4, 1)),), (2, 2, 1), 1, 2,
                          simulator=simulator)  # fmt: skip
    attack = make_attack("learned", pairs=32, epochs=2, hidden=8, batch=8)
    first = attack(target, seed=0)
    again = attack(target, seed=1)
    assert calls == list(range(32))  # trained once: the second call reused it
    np.testing.assert_array_equal(first.images, again.images)
    assert len(simulator.kept) == 1


def _toy_target(monkeypatch: pytest.MonkeyPatch) -> AttackTarget:
    """A one-layer model whose gradient is its input times the error, with a simulator, and the
    learned attack's default inverter trained on a small budget (a full one takes minutes)."""
    import keras

    from leakbench.attacks import learned as learned_module

    small = Budget(hidden=16, epochs=3, lr=1e-2, batch=16)
    monkeypatch.setattr(learned_module.LearnedInversion, "budget", lambda self: small)
    dense = keras.layers.Dense(2, use_bias=False, kernel_initializer=keras.initializers.Ones())
    model = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), dense])
    images = np.random.default_rng(1).uniform(size=(50, 2, 2, 1)).astype(np.float32)

    def share(x: np.ndarray, y: np.ndarray, draw: int) -> tuple[tf.Tensor, ...]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.nn.softmax_cross_entropy_with_logits(tf.one_hot(y, 2), model(x))
            )
        return tuple(tape.gradient(loss, model.trainable_variables))

    simulator = Simulator(images, np.arange(50) % 2, share, "toy")
    observed = share(images[:1], np.array([0]), 0)
    return AttackTarget(model, observed, (2, 2, 1), 1, 2, simulator=simulator)


def test_a_learned_start_is_the_learned_attacks_reconstruction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = _toy_target(monkeypatch)
    reference = make_attack("learned").run(target, tf.zeros(2, tf.int64)).images
    for name in ("dlg", "idlg", "ig"):
        starts = make_attack(name, start="learned").learned_starts([target])
        assert starts is not None
        np.testing.assert_array_equal(starts[0], reference.reshape(-1))
        assert make_attack(name).learned_starts([target]) is None
    # ig with a vanishing step stays at its start: the learned reconstruction.
    ig = make_attack("ig", start="learned", iterations=1, lr=1e-8, tv=0.0)
    out = ig(target, seed=0)
    np.testing.assert_allclose(out.images, np.clip(reference, 0, 1), atol=1e-6)
    # The start is keyed only when set: every committed trial key is unchanged.
    assert "start" not in make_attack("idlg").params()
    assert make_attack("idlg", start="learned").params()["start"] == "learned"


def test_a_learned_start_takes_the_learned_attacks_batches() -> None:
    with pytest.raises(ConfigError, match="at most 4"):
        make_attack("dlg", start="learned").check_batch_size(8)
    make_attack("dlg").check_batch_size(8)


def test_an_interrupted_training_resumes_from_its_folder_to_the_same_inverter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leakbench.attacks import learned as learned_module

    monkeypatch.setattr(learned_module, "SAVE_SECONDS", 0.0)
    real_fit = learned_module.fit
    interrupt = {"at": 2}

    def fit_until(*args: object, on_epoch: object = None, **kwargs: object) -> Inverter:
        def watched(state: Progress) -> None:
            on_epoch(state)  # type: ignore[operator]
            if state.epoch == interrupt["at"]:
                raise KeyboardInterrupt

        return real_fit(*args, on_epoch=watched, **kwargs)  # type: ignore[arg-type]

    def attack_in(folder: Path) -> tuple[np.ndarray, Simulator]:
        target = _toy_target(monkeypatch)
        simulator = dataclasses.replace(target.simulator, folder=folder, kept={})
        target = dataclasses.replace(target, simulator=simulator)
        attack = make_attack("learned", pairs=64)
        return attack.run(target, tf.zeros(2, tf.int64)).images, simulator

    whole, _ = attack_in(tmp_path / "whole")
    monkeypatch.setattr(learned_module, "fit", fit_until)
    with pytest.raises(KeyboardInterrupt):
        attack_in(tmp_path / "cut")
    assert len(list((tmp_path / "cut").glob("*.partial.npz"))) == 1
    interrupt["at"] = -1  # the second run is not interrupted
    resumed, _ = attack_in(tmp_path / "cut")
    np.testing.assert_array_equal(whole, resumed)
    record = json.loads(next((tmp_path / "cut").glob("*.json")).read_text())
    assert record["resumed_at_epoch"] == 2
    assert not list((tmp_path / "cut").glob("*.partial.npz"))
    # A third run reads the finished inverter back: no pair is computed again.
    again, simulator = attack_in(tmp_path / "cut")
    np.testing.assert_array_equal(whole, again)


def test_a_learning_attack_is_grouped_by_defense_configuration() -> None:
    from leakbench.run.pipelines import pipeline_for
    from leakbench.run.plan import attack_groups

    spec = parse_config(
        SMALL.format(dataset="digits", plugin=SCRAMBLE).replace("images = 4", "images = 12")
    )
    pipeline = pipeline_for(spec)
    trials = pipeline.plan(pipeline.load())
    groups = attack_groups(trials, 8)
    learned = [g for g in groups if g[0].attack.name == "learned"]
    # One uncut group of 12 per defense configuration: one process trains each inverter.
    assert sorted(
        (len(g), {t.defense.name for t in g} == {g[0].defense.name}) for g in learned
    ) == [(12, True), (12, True)]
    # Every other attack keeps the cells of several defenses together, cut at the width.
    others = [len(g) for g in groups if g[0].attack.name == "idlg"]
    assert sorted(others) == [8, 8, 8]
