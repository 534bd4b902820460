"""Training a text model under a defense (the one trainer, `leakbench.client.training`, of the
text modality): a step applies the defended update, training lowers held-out perplexity below
the untrained model's and the unigram baseline, DP-SGD trains on Poisson batches with one
trace, and the utility scores (`leakbench.modalities.text`) are checked by hand."""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.client import training
from leakbench.client.recipes import Recipe, make_optimizer
from leakbench.client.training import DefendedTrainer, run_epochs, train_text
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.defenses import make_defense
from leakbench.modalities.text import (
    TEXT,
    check_training,
    text_gradients,
    text_utility,
    unigram_perplexity,
)

LENGTH = 16


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[np.ndarray, np.ndarray, int]:
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=300)
    ids = vocab.encode_many(corpus.private, LENGTH)
    return ids[:1500], ids[1500:], len(vocab)


def test_unigram_perplexity_by_hand() -> None:
    # Counted targets: 5 6 3 | 5 3  -> shares 5: 2/5, 6: 1/5, 3 (<eos>): 2/5.
    train = np.array([[2, 5, 6, 3, 0], [2, 5, 3, 0, 0]])
    entropy = -(2 * 0.4 * math.log(0.4) + 0.2 * math.log(0.2))
    assert unigram_perplexity(train) == pytest.approx(math.exp(entropy))
    # On other rows: targets 6 3 -> exp(-(log 0.2 + log 0.4) / 2).
    other = np.array([[2, 6, 3, 0, 0]])
    assert unigram_perplexity(train, other) == pytest.approx(math.exp(-math.log(0.08) / 2))
    assert unigram_perplexity(train, np.array([[2, 7, 3]])) == math.inf


def test_a_uniform_model_scores_the_vocabulary_size() -> None:
    _, test, vocabulary = _rows()
    model = build_text_model("gru", vocabulary, LENGTH, seed=0)
    head = model.get_layer("head")
    head.set_weights([np.zeros_like(w) for w in head.get_weights()])
    scores = text_utility(model, test[:50], batch_size=16)
    assert scores["perplexity"] == pytest.approx(vocabulary, rel=1e-5)
    # Every logit ties, argmax is id 0 (<pad>), which no counted target is.
    assert scores["next_token_accuracy"] == 0.0
    assert scores["positions"] == int(np.sum(test[:50, 1:] != 0))


def test_a_step_applies_the_defended_update() -> None:
    train, _, vocabulary = _rows()
    model = build_text_model("gru", vocabulary, LENGTH, seed=1)
    batch = train[:8]
    raw = text_gradients(model, batch)[1]
    bound = float(tf.linalg.global_norm(raw)) / 2
    before = [v.numpy() for v in model.trainable_variables]
    clip = make_defense("clip", norm=bound)
    trainer = DefendedTrainer(model, clip, make_optimizer("sgd", 0.5), seed=0, modality=TEXT)
    loss, skipped, _ = trainer.step(batch, batch)
    assert not bool(skipped) and np.isfinite(float(loss))
    for w0, v, g in zip(before, model.trainable_variables, raw, strict=True):
        np.testing.assert_allclose(v.numpy(), w0 - 0.5 * np.asarray(g) / 2, rtol=1e-4, atol=1e-7)


def test_training_lowers_perplexity_below_the_untrained_model_and_the_unigram() -> None:
    train, test, vocabulary = _rows()
    report = train_text(
        "transformer", vocabulary, LENGTH, train, test, make_defense("none"), seed=0, epochs=2
    )
    assert report["traces"] == 1 and report["skipped_steps"] == 0
    assert report["steps"] == 2 * (len(train) // 32)
    assert report["epsilon"] is None
    # Untrained: near-uniform over the vocabulary.
    assert report["initial_perplexity"] == pytest.approx(vocabulary, rel=0.1)
    baseline = unigram_perplexity(train)
    assert report["perplexity"] < baseline < report["initial_perplexity"]
    assert report["next_token_accuracy"] > report["initial_next_token_accuracy"]


def test_dpsgd_trains_on_poisson_batches_with_one_trace() -> None:
    train, test, vocabulary = _rows()
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    rows = train[:256]
    report = train_text(
        "gru", vocabulary, LENGTH, rows, test[:64], dpsgd, seed=0, epochs=1, batch_size=32
    )
    assert report["steps"] == 8 and report["traces"] == 1
    assert report["epsilon"] == pytest.approx(dpsgd.epsilon(32 / 256, 8, 1e-5))
    assert np.isfinite(report["perplexity"])


def test_an_empty_poisson_batch_releases_only_noise() -> None:
    train, _, vocabulary = _rows()
    model = build_text_model("gru", vocabulary, LENGTH, seed=2)
    before = [v.numpy() for v in model.trainable_variables]
    quiet = make_defense("dpsgd", norm=1.0, noise_multiplier=0.0)
    trainer = DefendedTrainer(model, quiet, make_optimizer("sgd", 1.0), seed=0, modality=TEXT)
    empty = np.zeros((0, LENGTH), np.int32)
    loss, skipped, _ = trainer.sampled_step(empty, empty, 8)
    assert math.isnan(float(loss)) and not bool(skipped)
    for w0, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(v.numpy(), w0)  # no noise, no rows: no change
    trainer.sampled_step(train[:5], train[:5], 8)
    trainer.sampled_step(train[:3], train[:3], 8)  # another batch size, the same trace
    assert trainer.traces == 1 and int(trainer.step_count.numpy()) == 3
    noisy = DefendedTrainer(
        model,
        make_defense("dpsgd", norm=1.0, noise_multiplier=1.0),
        make_optimizer("sgd", 1.0),
        seed=0,
        modality=TEXT,
    )
    kept = [v.numpy() for v in model.trainable_variables]
    noisy.sampled_step(empty, empty, 8)
    assert not np.allclose(model.trainable_variables[0].numpy(), kept[0])


def test_bad_settings_are_one_line_config_errors() -> None:
    train, test, vocabulary = _rows()
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1, got 0"):
        check_training(train, vocabulary, epochs=0, batch_size=8)
    with pytest.raises(ConfigError, match="batch_size must be at most the training rows"):
        check_training(train[:4], vocabulary, epochs=1, batch_size=8)
    with pytest.raises(ConfigError, match="beyond vocabulary_size 10"):
        check_training(train, 10, epochs=1, batch_size=8)
    with pytest.raises(ConfigError, match="optimizer must be one of sgd, adam"):
        make_optimizer("rmsprop", 0.1)
    with pytest.raises(ConfigError, match="learning_rate must be a number in"):
        make_optimizer("sgd", 0.0)
    with pytest.raises(ConfigError, match="defense mixup does not apply to text models"):
        train_text("gru", vocabulary, LENGTH, train, test, make_defense("mixup"), epochs=1)


def test_run_epochs_reports_the_text_run() -> None:
    train, _, vocabulary = _rows()
    model = build_text_model("gru", vocabulary, LENGTH, seed=0)
    recipe = Recipe("default", 2, 30, "adam", (1e-3,))
    trainer = DefendedTrainer(
        model, make_defense("none"), recipe.make_optimizer(1e-3), seed=0, modality=TEXT
    )
    rows = train[:100]
    report = run_epochs(trainer, recipe, (rows, rows), seed=0, delta=1e-5)
    assert report.steps == 6  # 2 epochs of 100 // 30 batches, the last 10 rows dropped
    assert report.traces == 1 and np.isfinite(report.final_loss)


def test_frozen_embeddings_keep_their_seeded_values_while_the_rest_trains(monkeypatch) -> None:
    train, test, vocabulary = _rows()
    built: list[keras.Model] = []

    def recording(*args: object, **kwargs: object) -> keras.Model:
        built.append(build_text_model(*args, **kwargs))  # type: ignore[arg-type]
        return built[-1]

    monkeypatch.setattr(training, "build_text_model", recording)
    seeded = build_text_model("transformer", vocabulary, LENGTH, seed=0)
    report = train_text(
        "transformer",
        vocabulary,
        LENGTH,
        train[:128],
        test[:32],
        make_defense("none"),
        seed=0,
        epochs=1,
        freeze_embeddings=True,
    )
    trained = built[-1]
    assert report["steps"] == 4
    embedding = trained.get_layer(EMBEDDING)
    assert not embedding.trainable
    np.testing.assert_array_equal(
        embedding.embeddings.numpy(), seeded.get_layer(EMBEDDING).embeddings.numpy()
    )
    for before, after in zip(seeded.weights, trained.weights, strict=True):
        unchanged = np.array_equal(before.numpy(), after.numpy())
        assert unchanged == (before.path == embedding.embeddings.path), before.path
