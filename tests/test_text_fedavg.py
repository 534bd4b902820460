"""FedAvg and secure aggregation on text (issue 43): the client's weight change equals local SGD
run by hand, a step whose gradient is not finite is skipped, the attacks read the update as
the run hands it to them (bag of words exact, span never wrongly exact), K clients' mean is
attacked, the keys and the board tell the threat models apart, and bad lines exit 2."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from cli_capture import run_cli

from leakbench.attacks.text.bag_of_words import MARKS, BagOfWords
from leakbench.attacks.text.base import TextTarget
from leakbench.attacks.text.span import VERIFIED, SpanAttack, relative_distance
from leakbench.client.update import defended_update, local_change, observer
from leakbench.components.text_models import build_text_model
from leakbench.core.federated import LocalTraining
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.defenses import make_defense
from leakbench.modalities.text import TEXT, assert_dense, read_tokens, text_gradients
from leakbench.outputs.board import threat_model
from leakbench.run.config import parse_config
from leakbench.run.text import TextContext, plan_text

LENGTH = 8
WORDS = 120
SEED = tf.constant([5, 9], tf.int64)


def _update(model, ids, defense, seed, local=None):
    """A text client's shared update (`leakbench.client.update.defended_update`, text)."""
    return defended_update(defense, model, ids, ids, seed, local, TEXT)


def _change(model, ids, local):
    """A text client's weight change after its local steps (`local_change`, text)."""
    return local_change(model, ids, ids, local, TEXT)


@functools.cache
def _vocabulary_and_ids() -> tuple[int, np.ndarray]:
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=WORDS)
    return len(vocab), vocab.encode_many(corpus.private[10:14], LENGTH)


def _model() -> keras.Model:
    size, _ = _vocabulary_and_ids()
    return build_text_model("transformer", size, LENGTH, seed=0)


@functools.cache
def _shared_model() -> keras.Model:
    """One model for the tests that never change it (the span attack's traced checks are
    cached per model, so they trace once for the file)."""
    return _model()


def _hand_run(ids: np.ndarray, local: LocalTraining) -> list[np.ndarray]:
    """Local SGD as a reader would write it: assign ``w - lr * g`` to a fresh copy of the
    model, one mini-batch at a time (examples [k b, (k+1) b) in order, wrapping), and return
    ``w_0 - w_S``."""
    model = _model()
    start = [v.numpy().copy() for v in model.trainable_variables]
    size = local.batch_size or len(ids)
    for step in range(local.steps):
        first = (step * size) % len(ids)
        _, grads = text_gradients(model, ids[first : first + size])
        for var, grad in zip(model.trainable_variables, grads, strict=True):
            var.assign(var - local.lr * grad)
    return [w0 - v.numpy() for w0, v in zip(start, model.trainable_variables, strict=True)]


@pytest.mark.parametrize("batch", [0, 2], ids=["whole-batch", "minibatches-of-2"])
def test_fedavg_update_is_local_sgd_run_by_hand(batch: int) -> None:
    _, ids = _vocabulary_and_ids()
    local = LocalTraining(steps=4, lr=0.1, batch_size=batch)
    hand = _hand_run(ids, local)
    shared = _update(_shared_model(), ids, make_defense("none"), SEED, local)
    assert_dense(shared)
    for got, want in zip(shared, hand, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6)
    assert max(float(np.abs(w).max()) for w in hand) > 1e-2  # the steps moved the weights
    if batch:
        return
    # The traced observer gives the same update, and new seeds reuse its one trace.
    model = _shared_model()
    observe = observer(make_defense("none"), model, local, TEXT)
    for key in ([0, 1], [0, 2]):
        traced = observe(tf.constant(ids), tf.constant(ids), tf.constant(key, tf.int64))
        for got, want in zip(traced, hand, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6)
    assert observe.experimental_get_tracing_count() == 1


def test_the_defense_acts_on_the_weight_change() -> None:
    _, ids = _vocabulary_and_ids()
    model, local = _shared_model(), LocalTraining(steps=3, lr=0.1)
    gaussian = make_defense("gaussian", sigma=0.001)
    change = _change(model, ids, local)
    shared = _update(model, ids, gaussian, SEED, local)
    expected = gaussian.apply(change, seed=SEED)
    for got, want in zip(shared, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="acts per example"):
        _update(model, ids, make_defense("dpsgd", noise_multiplier=1.0, norm=1.0), SEED, local)


def test_a_step_whose_gradient_is_not_finite_is_skipped() -> None:
    _, ids = _vocabulary_and_ids()
    model = _shared_model()
    # A rate of 1e30 sends the first step's weights near 1e28: finite, but the next forward
    # pass overflows, so every later step's gradient is not finite and is skipped.
    one = _change(model, ids, LocalTraining(steps=1, lr=1e30))
    four = _change(model, ids, LocalTraining(steps=4, lr=1e30))
    assert all(np.isfinite(np.asarray(c)).all() for c in four)
    for a, b in zip(four, one, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _target(ids: np.ndarray, local: LocalTraining | None, clients: int = 1) -> TextTarget:
    """The target as the run builds it (`TextContext.target`): the update divided by
    ``steps * lr`` under FedAvg."""
    size, _ = _vocabulary_and_ids()
    model = _shared_model()
    parts = len(ids) // clients
    updates = [
        _update(model, ids[k * parts : (k + 1) * parts], make_defense("none"), SEED,
                             local)
        for k in range(clients)
    ]  # fmt: skip
    update = [tf.add_n(list(u)) / clients for u in zip(*updates, strict=True)]
    scale = local.scale if local is not None else 1.0
    observed = tuple(g / scale for g in update)
    return TextTarget(model, observed, len(ids), LENGTH, size, ids[:0], local, clients)


def _words(ids: np.ndarray) -> set[int]:
    return {int(t) for t in read_tokens(ids) if t not in MARKS}


def test_bag_of_words_is_exact_on_a_fedavg_update() -> None:
    _, ids = _vocabulary_and_ids()
    target = _target(ids, LocalTraining(steps=4, lr=0.1, batch_size=2))
    found, _ = BagOfWords().bag(target)
    assert set(found.tolist()) == _words(ids)
    assert len(found) >= 8  # four sentences' worth of distinct words


def test_span_is_not_wrongly_exact_on_a_four_step_update() -> None:
    _, ids = _vocabulary_and_ids()
    target = _target(ids, LocalTraining(steps=4, lr=0.1))
    result = SpanAttack().run(target, SEED)
    assert "FedAvg update of 4 local steps" in result.note
    if result.stop_reason == "exact":
        # Its check simulates the four steps: an exact answer is the batch (rows in any order).
        assert sorted(map(tuple, result.ids.tolist())) == sorted(map(tuple, ids.tolist()))
    else:
        assert result.stop_reason == "beyond_rank" or result.loss >= VERIFIED


def test_span_answer_check_simulates_the_local_steps() -> None:
    _, ids = _vocabulary_and_ids()
    local = LocalTraining(steps=4, lr=0.1)
    target = _target(ids, local)
    # The true batch reproduces the update to round-off; one word changed does not.
    assert relative_distance(target, ids) < 1e-5
    wrong = ids.copy()
    wrong[0, 1] = 5 if wrong[0, 1] != 5 else 6
    assert relative_distance(target, wrong) > VERIFIED
    # Read as one gradient step (no local training known), even the truth fails the check:
    # the update is not the gradient of the batch.
    plain = dataclasses.replace(target, local=None)
    assert relative_distance(plain, ids) > VERIFIED


def test_two_clients_mean_is_attacked() -> None:
    _, ids = _vocabulary_and_ids()
    target = _target(ids, None, clients=2)
    model = target.model
    # The mean of each client's own gradient, client k holding sentences [2k, 2k + 2).
    halves = [text_gradients(model, ids[k * 2 : k * 2 + 2])[1] for k in range(2)]
    for got, a, b in zip(target.gradients, *halves, strict=True):
        np.testing.assert_allclose(np.asarray(got), (np.asarray(a) + np.asarray(b)) / 2, atol=1e-7)
    found, _ = BagOfWords().bag(target)
    assert set(found.tolist()) == _words(ids)  # the union of both clients' words
    result = SpanAttack().run(target, SEED)
    assert "mean of 2 clients' updates" in result.note
    if result.stop_reason == "exact":
        assert sorted(map(tuple, result.ids.tolist())) == sorted(map(tuple, ids.tolist()))


RUN = """\
name = "tiny-fed"
dataset = "tinyshakespeare"
model = "gru"
suite = "listed"
images = {images}

[[attack]]
name = "bag_of_words"

[[defense]]
{defense}

[threat_model]
{threat}

[text]
sequence_length = 12
max_words = 200
batch_sizes = [1, 2]
test_sentences = 20
train_epochs = 0
"""


def _run(threat: str, images: int = 4, defense: str = 'name = "none"') -> str:
    return RUN.format(threat=threat, images=images, defense=defense)


def test_plan_keys_and_board_label_tell_threat_models_apart() -> None:
    fedsgd = parse_config(_run(""))
    fedavg = parse_config(_run("local_steps = 4"))
    two = parse_config(_run("clients = 2"))
    assert not {t.key for t in plan_text(fedsgd, 200)} & {t.key for t in plan_text(fedavg, 200)}
    # Two clients: each trial attacks B x 2 sentences; its batch_size column is B.
    trials = plan_text(two, 200)
    assert {(t.batch_size, len(t.indices)) for t in trials} == {(1, 2), (2, 4)}
    assert len(trials) == 2 + 1  # 4 sentences: two batches of 1 x 2, one of 2 x 2
    config = {"threat_model": {"local_steps": 4, "clients": 1}}
    assert threat_model(config, 4) == "honest server, FedAvg 4 local steps, batch 4"
    assert "secure aggregation of 2 clients" in threat_model({"threat_model": {"clients": 2}}, 1)


def test_a_two_client_text_run_attacks_the_mean(tmp_path: Path) -> None:
    config = tmp_path / "fed.toml"
    config.write_text(_run("clients = 2"), encoding="utf-8")
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 0, result.err
    trials = pd.read_csv(tmp_path / "out" / "trials.csv")
    # 3 trials (two of 1 x 2 sentences, one of 2 x 2): a row per sentence.
    assert len(trials) == 2 * 2 + 4 and set(trials["batch_size"]) == {1, 2}
    assert (trials["bag_precision"] == 1.0).all() and (trials["bag_recall"] == 1.0).all()
    assert "clients = 2" in (tmp_path / "out" / "config.toml").read_text(encoding="utf-8")


def test_the_run_hands_the_attacks_the_change_divided_by_steps_times_lr() -> None:
    corpus = load_text_corpus("tinyshakespeare")
    ids = TextContext.of(parse_config(_run("")), corpus).private_ids[:4]
    fedavg = TextContext.of(parse_config(_run("local_steps = 3\nlocal_lr = 0.2")), corpus)
    target = fedavg.target(0, ids, tuple(fedavg.observe(0, make_defense("none"), ids, 7)))
    assert target.local == LocalTraining(3, 0.2, 0) and target.clients == 1
    change = _change(fedavg.model(0), ids, LocalTraining(3, 0.2, 0))
    for got, want in zip(target.gradients, change, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want) / 0.6, rtol=1e-4, atol=1e-8)


DPSGD = 'name = "dpsgd"\nnoise_multiplier = 1.0\nnorm = 1.0'
BAD = [
    (
        "fedavg-with-clients",
        _run("local_steps = 4\nclients = 2"),
        "threat_model: FedAvg (local_steps or local_epochs above 1) with clients above 1 is "
        "not supported yet",
    ),
    ("lr-without-steps", _run("local_lr = 0.5"), "threat_model.local_lr has no effect"),
    ("steps-and-epochs", _run("local_steps = 2\nlocal_epochs = 2"), "not both"),
    (
        "minibatch-above-smallest-batch",
        _run("local_steps = 2\nlocal_batch_size = 2"),
        "threat_model.local_batch_size must be at most the smallest text.batch_sizes (1)",
    ),
    ("per-example-defense", _run("local_steps = 2", defense=DPSGD), "acts per example"),
    ("malicious-server", _run('server = "malicious"'), "threat_model.server: a text run"),
    ("weights", _run('shares = "weights"'), "threat_model.shares: a text run"),
    ("too-few-for-clients", _run("clients = 3"), "x threat_model.clients (6)"),
]


@pytest.mark.parametrize(("text", "needle"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_threat_model_lines_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text, encoding="utf-8")
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 2, result
    assert len(result.err.splitlines()) == 1 and result.err.startswith("leakbench: error: ")
    assert needle in result.err, result.err
    assert not (tmp_path / "out").exists()
