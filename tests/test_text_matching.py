"""The text matching attack `tag`: its forward from embeddings, its prior, and its recovery."""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks.base import ATTACKS
from leakbench.attacks.text.base import TextTarget
from leakbench.attacks.text.forward import (
    embedding_forward,
    embedding_table,
    soft_next_token_loss,
)
from leakbench.attacks.text.matching import (
    TAG,
    Problem,
    answer_loss,
    bigram_nll,
    candidate_ids,
    matching_distance,
    propose,
)
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import BOS, PAD, build_vocabulary, load_text_corpus
from leakbench.modalities.text import next_token_loss, read_tokens, text_gradients

LENGTH = 8


@functools.lru_cache(maxsize=1)
def _data():
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=500)
    return vocab, corpus.private, vocab.encode_many(corpus.public, LENGTH)


@functools.cache
def _model(name: str, tie: bool = False) -> keras.Model:
    vocab, _, _ = _data()
    return build_text_model(name, len(vocab), LENGTH, seed=0, tie_embeddings=tie)


def _target(name: str, ids: np.ndarray, tie: bool = False) -> TextTarget:
    vocab, _, public = _data()
    model = _model(name, tie)
    _, gradients = text_gradients(model, ids)
    return TextTarget(model, tuple(gradients), ids.shape[0], ids.shape[1], len(vocab), public)


def _private(batch: int, start: int) -> np.ndarray:
    vocab, lines, _ = _data()
    return vocab.encode_many(lines[start : start + batch], LENGTH)


def _overlap(recovered: np.ndarray, truth: np.ndarray) -> float:
    """Unigram F1 (ROUGE-1-like) of two id rows after ``<bos>``, padding left out."""
    found = collections.Counter(int(i) for i in recovered[1:] if i != PAD)
    true = collections.Counter(int(i) for i in truth[1:] if i != PAD)
    hits = sum((found & true).values())
    if not hits:
        return 0.0
    precision, recall = hits / sum(found.values()), hits / sum(true.values())
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize(("name", "tie"), [("transformer", False), ("gru", False), ("gru", True)])
def test_the_forward_from_embeddings_is_the_model(name: str, tie: bool) -> None:
    model = _model(name, tie)
    ids = _private(3, 2)  # a short line among them: padding and a cut <eos>
    assert (ids == PAD).any()
    forward, table = embedding_forward(model), embedding_table(model)
    logits = model(ids[:, :-1])
    np.testing.assert_array_equal(forward(tf.gather(table, ids[:, :-1])), logits)
    # One-hot distributions over a candidate subset give the client's loss and gradient.
    candidates = np.unique(np.concatenate([ids.ravel(), [PAD, 7, 11]]))
    position = {int(c): k for k, c in enumerate(candidates)}
    choice = np.vectorize(position.get)(ids)
    onehot = tf.one_hot(choice, len(candidates))
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        soft = soft_next_token_loss(forward, table, onehot, tf.constant(candidates, tf.int32))
    ours = [tf.convert_to_tensor(g) for g in tape.gradient(soft, variables)]
    client_loss, client = text_gradients(model, ids)
    np.testing.assert_allclose(float(soft), float(next_token_loss(model, ids)), rtol=1e-6)
    assert abs(float(soft) - float(client_loss)) < 1e-5
    # Equal up to float32 rounding: the one-hot product and the embedding lookup sum in other
    # orders, and on an AMD EPYC one entry of 0.11 differs by 1.1e-7 (about 15 units in the last
    # place), which rtol = 1e-7 refused; a wrong gradient differs by percents.
    for a, b in zip(ours, client, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(matching_distance(ours, client, "tag", 0.01)) < 1e-3
    assert float(matching_distance(ours, client, "cosine", 0.0)) < 1e-5


def test_a_model_without_a_token_embedding_is_refused() -> None:
    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = keras.layers.CategoryEncoding(20, output_mode="one_hot")(ids[..., None])
    plain = keras.Model(ids, keras.layers.Dense(20)(hidden))
    with pytest.raises(ConfigError, match="has no keras.layers.Embedding layer"):
        TAG().check_model(plain)


def test_the_bigram_prior_by_hand() -> None:
    nll = bigram_nll(np.array([[BOS, 5, 3, PAD]]), 6)
    # Row BOS saw 5 once: (1 + 0.1) / (1 + 6 * 0.1); the other ids 0.1 / 1.6.
    assert nll[BOS, 5] == pytest.approx(-math.log(1.1 / 1.6))
    assert nll[BOS, 4] == pytest.approx(-math.log(0.1 / 1.6))
    assert nll[3, PAD] == pytest.approx(-math.log(1.1 / 1.6))
    np.testing.assert_allclose(nll[1], -math.log(1 / 6))  # an unseen row is uniform


@pytest.mark.parametrize("tie", [False, True])
def test_the_candidates_hold_every_token_and_less_than_the_vocabulary(tie: bool) -> None:
    ids = _private(4, 0)
    target = _target("transformer", ids, tie)
    found = candidate_ids(target.model, target.gradients, target.vocabulary_size, "bag")
    assert set(ids.ravel()) <= set(found.tolist())
    assert set(read_tokens(ids)) <= set(found.tolist())
    assert len(found) < 60 < target.vocabulary_size
    full = candidate_ids(target.model, target.gradients, target.vocabulary_size, "full")
    assert len(full) == target.vocabulary_size


def test_a_frozen_embedding_leaves_the_targets_as_candidates_and_the_attack_runs() -> None:
    vocab, _, public = _data()
    model = build_text_model("transformer", len(vocab), LENGTH, seed=0)
    model.get_layer(EMBEDDING).trainable = False
    ids = _private(2, 0)
    _, gradients = text_gradients(model, ids)
    target = TextTarget(model, tuple(gradients), 2, LENGTH, len(vocab), public)
    found = candidate_ids(model, target.gradients, target.vocabulary_size, "bag")
    # Every token after <bos> is some position's target; <bos> and padding are special ids.
    assert set(ids.ravel()) <= set(found.tolist())
    assert len(found) < 40
    result = TAG(iterations=20).run(target, tf.constant([0, 0], tf.int64))
    assert result.ids.shape == ids.shape


def test_a_move_keeps_each_sequence_s_tokens() -> None:
    rng = np.random.default_rng(0)
    choice = np.arange(14).reshape(2, 7)
    for _ in range(50):
        moved = propose(choice, rng)
        changed = [r for r in range(2) if not np.array_equal(moved[r], choice[r])]
        assert len(changed) <= 1
        for r in range(2):
            assert sorted(moved[r]) == sorted(choice[r])
        choice = moved


def test_the_attack_recovers_a_line_far_above_a_random_draw_from_the_bag() -> None:
    ids = _private(1, 10)
    target = _target("transformer", ids)
    result = ATTACKS.get("tag")(iterations=300).run(target, tf.constant([0, 1], tf.int64))
    assert result.ids.shape == ids.shape and result.ids[0, 0] == BOS
    score = _overlap(result.ids[0], ids[0])
    found = candidate_ids(target.model, target.gradients, target.vocabulary_size, "bag")
    rng = np.random.default_rng(0)
    draws = [np.concatenate([[BOS], rng.choice(found, size=LENGTH - 1)]) for _ in range(200)]
    chance = float(np.mean([_overlap(d, ids[0]) for d in draws]))
    # The bag is small, so even a random draw from it shares many words (order-blind); the
    # attack must find nearly all of them and also their places.
    accuracy = float(np.mean(result.ids[0, 1:] == ids[0, 1:]))
    chance_accuracy = float(np.mean([np.mean(d[1:] == ids[0, 1:]) for d in draws]))
    assert score >= 0.85 and score > chance + 0.25, (score, chance)
    assert accuracy >= 0.8 and chance_accuracy < 0.25, (accuracy, chance_accuracy)
    assert result.stop_reason in ("converged", "stalled", "budget")
    assert result.iterations_used <= result.budget == 300


def test_the_loss_decreases_and_a_seed_gives_one_answer() -> None:
    target = _target("transformer", _private(1, 20))
    seed = tf.constant([3, 4], tf.int64)
    short = TAG(iterations=1).run(target, seed)
    long = TAG(iterations=60, window=30, restarts=2).run(target, seed)
    again = TAG(iterations=60, window=30, restarts=2).run(target, seed)
    assert long.loss < short.loss
    assert long.budget == 120 and 0 < long.iterations_used <= 120
    np.testing.assert_array_equal(long.ids, again.ids)
    assert long.loss == again.loss and long.stop_reason == again.stop_reason


def test_swaps_only_lower_the_objective_with_the_prior() -> None:
    attack = TAG(prior_weight=0.05, swaps=40)
    problem = Problem(attack, _target("gru", _private(1, 30)))
    evaluate = answer_loss(problem)
    start = np.random.default_rng(1).integers(0, problem.shape[2], problem.shape[:2])
    before = float(evaluate(tf.constant(start, tf.int32))[0])
    loss, choice = attack._swap(evaluate, start, before, np.random.default_rng(2))
    assert loss < before and math.isfinite(loss)  # a random start has better orders
    assert loss == float(evaluate(tf.constant(choice, tf.int32))[0])
    assert sorted(choice[0]) == sorted(start[0])  # moves only reorder
    prior = float(problem.objective(problem.answer_probs(choice))[0])
    assert prior - float(problem.objective(problem.answer_probs(choice))[1]) > 0  # prior counted


def test_the_attack_reads_only_the_target_and_the_public_pool() -> None:
    assert list(inspect.signature(TAG.run).parameters) == ["self", "target", "seed"]
    fields = {f.name for f in dataclasses.fields(TextTarget)}
    assert fields == {
        "model",
        "gradients",
        "batch_size",
        "sequence_length",
        "vocabulary_size",
        "public_ids",
        # What the server knows of the threat model: the clients' local training and count.
        "local",
        "clients",
    }
    ids = _private(1, 10)
    _, _, public = _data()
    assert not (public == ids[0]).all(axis=1).any()  # the prior's data hold no private row
    problem = Problem(TAG(), _target("transformer", ids))
    assert problem.shape == (1, LENGTH - 1, len(problem.ids))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"iterations": 0}, "text attack tag: iterations must be an integer in"),
        ({"loss": "l3"}, "text attack tag: loss must be 'tag' or 'cosine'"),
        ({"restrict": "some"}, "text attack tag: restrict must be 'bag' or 'full'"),
        ({"prior_weight": -1}, "text attack tag: prior_weight must be a number in"),
    ],
)
def test_bad_settings_are_one_line(setting: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        TAG(**setting)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
