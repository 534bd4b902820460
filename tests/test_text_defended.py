"""A text client's update under a defense (`leakbench.client.update.defended_update`, text):
the identity for none, clipping bounds the norm, DP-SGD's per-example path equals a loop over
the rows, every registered defense is either applied densely or refused in one line, and the
compiled observer traces once."""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.client.update import defended_update, observer
from leakbench.components.text_models import build_text_model
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.defenses import DEFENSES, make_defense
from leakbench.modalities.text import (
    TEXT,
    assert_dense,
    check_text_defense,
    per_example_text_gradients,
    text_gradients,
)

LENGTH = 12
SEED = tf.constant([3, 7], tf.int64)


@functools.lru_cache(maxsize=1)
def _ids() -> np.ndarray:
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, max_words=120)
    # Private lines of different lengths: some end in <eos> and padding, some are cut at L.
    return vocab.encode_many(corpus.private[10:14], LENGTH)


@functools.cache
def _model(name: str) -> keras.Model:
    return build_text_model(name, 124, LENGTH, seed=0)


def _close(a: list[tf.Tensor], b: list[tf.Tensor], **tolerance: float) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tolerance)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_no_defense_shares_the_dense_gradient(name: str) -> None:
    model, ids = _model(name), _ids()
    shared = defended_update(make_defense("none"), model, ids, ids, SEED, None, TEXT)
    assert_dense(shared)
    _close(shared, text_gradients(model, ids)[1], rtol=0, atol=0)


def test_clipping_bounds_the_norm() -> None:
    model, ids = _model("gru"), _ids()
    raw = text_gradients(model, ids)[1]
    norm = float(tf.linalg.global_norm(raw))
    bound = norm / 4
    shared = defended_update(make_defense("clip", norm=bound), model, ids, ids, SEED, None, TEXT)
    assert float(tf.linalg.global_norm(shared)) == pytest.approx(bound, rel=1e-5)
    _close(shared, [g / 4 for g in raw], rtol=1e-5, atol=1e-9)
    loose = defended_update(make_defense("clip", norm=2 * norm), model, ids, ids, SEED, None, TEXT)
    _close(loose, raw, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_dpsgd_per_example_path_equals_a_loop(name: str) -> None:
    model, ids = _model(name), _ids()
    loop = [text_gradients(model, ids[b : b + 1]) for b in range(len(ids))]
    losses, per_example = per_example_text_gradients(model, ids)
    np.testing.assert_allclose(losses, [float(loss) for loss, _ in loop], rtol=1e-5)
    stacked = [tf.stack(parts) for parts in zip(*(grads for _, grads in loop), strict=True)]
    _close(per_example, stacked, rtol=1e-4, atol=1e-7)
    dpsgd = make_defense("dpsgd", norm=0.05, noise_multiplier=1.0)
    shared = defended_update(dpsgd, model, ids, ids, SEED, None, TEXT)
    assert_dense(shared)
    _close(shared, dpsgd(stacked, seed=SEED), rtol=1e-4, atol=1e-6)
    # The noise is keyed by the seed: another seed, another update.
    other = defended_update(dpsgd, model, ids, ids, tf.constant([3, 8], tf.int64), None, TEXT)
    assert not np.allclose(np.asarray(other[0]), np.asarray(shared[0]))


def test_every_defense_is_applied_densely_or_refused_in_one_line() -> None:
    model, ids = _model("gru"), _ids()
    refused = {}
    # The built-in defenses: a test file of the same worker process may have registered one of
    # its own (tests/test_one_file_defense.py's "unsampled" has no samples to build it from).
    builtin = [n for n in sorted(DEFENSES) if DEFENSES.get(n).__module__.startswith("leakbench.")]
    for name in builtin:
        samples = DEFENSES.get(name).samples
        defense = make_defense(name, **dict(samples[0].params))
        try:
            check_text_defense(defense)
        except ConfigError as err:
            refused[name] = str(err)
            continue
        shared = defended_update(defense, model, ids, ids, SEED, None, TEXT)
        assert_dense(shared)
        assert [g.shape for g in shared] == [v.shape for v in model.trainable_variables]
    assert set(refused) == {"mixup", "soteria", "precode"}
    for name, message in refused.items():
        assert message.startswith(f"defense {name} does not apply to text models: ")
        assert "\n" not in message


def test_a_chain_is_refused_for_its_step() -> None:
    chain = make_defense(
        "chain", steps=[{"name": "clip", "norm": 1.0}, {"name": "mixup", "mixed": 2}]
    )
    with pytest.raises(ConfigError, match=r"^defense mixup does not apply to text models \(step"):
        check_text_defense(chain)
    fine = make_defense(
        "chain", steps=[{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.1}]
    )
    check_text_defense(fine)


def test_the_observer_traces_once_per_shape() -> None:
    model, ids = _model("transformer"), _ids()
    for defense in (
        make_defense("gaussian", sigma=0.01),
        make_defense("dpsgd", norm=1.0, noise_multiplier=1.0),
    ):
        observe = observer(defense, model, None, TEXT)
        first = observe(tf.constant(ids), tf.constant(ids), SEED)
        flipped = tf.constant(ids[::-1].copy())
        again = observe(flipped, flipped, tf.constant([4, 1], tf.int64))
        repeat = observe(tf.constant(ids), tf.constant(ids), SEED)
        assert observe.experimental_get_tracing_count() == 1
        assert_dense(first)
        _close(first, repeat, rtol=0, atol=0)
        assert not np.allclose(np.asarray(first[0]), np.asarray(again[0]))
        eager = defended_update(defense, model, ids, ids, SEED, None, TEXT)
        _close(first, eager, rtol=1e-4, atol=1e-6)
    with pytest.raises(ConfigError, match="defense mixup does not apply"):
        observer(make_defense("mixup"), model, None, TEXT)
