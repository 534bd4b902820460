"""Text models, the dense wire of a text client, and the bag-of-words attack on it."""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks.text.bag_of_words import bag_of_words, bag_scores
from leakbench.components.models import MODELS, build_model
from leakbench.components.text_models import build_text_model, embedding_index
from leakbench.core.errors import ConfigError, UnknownNameError
from leakbench.datasets.text_base import PAD, build_vocabulary, load_text_corpus
from leakbench.modalities.text import (
    assert_dense,
    next_token_loss,
    raw_gradients,
    read_tokens,
    text_gradients,
)

LENGTH = 16


@functools.lru_cache(maxsize=1)
def _vocab_and_lines():
    corpus = load_text_corpus("tinyshakespeare")
    return build_vocabulary(corpus, max_words=500), corpus.private


def _ids(batch: int, start: int = 0) -> np.ndarray:
    vocab, lines = _vocab_and_lines()
    return vocab.encode_many(lines[start : start + batch], LENGTH)


@functools.cache
def _model(name: str, tie: bool) -> keras.Model:
    vocab, _ = _vocab_and_lines()
    return build_text_model(name, len(vocab), LENGTH, seed=0, tie_embeddings=tie)


def test_every_built_in_model_has_its_modality() -> None:
    assert set(MODELS.names("text")) == {"transformer", "gru"}
    image = {"lenet", "mlp", "convnet", "convnet64", "resnet", "resnet18"}
    assert image <= set(MODELS.names("image"))
    assert not set(MODELS.names("text")) & set(MODELS.names("image"))
    assert {MODELS.modality_of(name) for name in image} == {"image"}
    assert MODELS.modality_of("gru") == MODELS.modality_of("transformer") == "text"


def test_each_builder_refuses_the_other_modality_in_one_line() -> None:
    with pytest.raises(UnknownNameError) as image:
        build_model("gru", (8, 8, 1), 10, seed=0)
    assert str(image.value) == (
        "model 'gru' is a text model, not an image one; image models: "
        + ", ".join(MODELS.names("image"))
    )
    with pytest.raises(UnknownNameError) as text:
        build_text_model("lenet", 50, LENGTH, seed=0)
    assert str(text.value) == (
        "model 'lenet' is an image model, not a text one; text models: gru, transformer"
    )
    with pytest.raises(UnknownNameError, match="unknown model 'nope'"):
        build_text_model("nope", 50, LENGTH, seed=0)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_ids_in_next_token_logits_out(name: str) -> None:
    model = _model(name, False)
    ids = _ids(3)
    logits = model(ids[:, :-1])
    assert logits.shape == (3, LENGTH - 1, 504)
    again = build_text_model(name, 504, LENGTH, seed=0)
    other = build_text_model(name, 504, LENGTH, seed=1)
    np.testing.assert_array_equal(again(ids), model(ids))  # seeded
    assert not np.allclose(other(ids), model(ids))
    loss = float(next_token_loss(model, ids))
    assert abs(loss - np.log(504)) < 0.5  # near-uniform at initialisation


def test_the_transformer_is_causal() -> None:
    model = _model("transformer", False)
    ids = _ids(1, start=5)
    changed = ids.copy()
    changed[0, 6] = 7 if ids[0, 6] != 7 else 8
    before, after = np.asarray(model(ids)), np.asarray(model(changed))
    np.testing.assert_allclose(before[:, :6], after[:, :6], atol=1e-6)
    assert not np.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_tying_shares_the_input_embedding(name: str) -> None:
    untied, tied = _model(name, False), _model(name, True)
    assert {v.path.split("/")[0] for v in untied.trainable_variables} >= {"head"}
    assert "head" not in {v.path.split("/")[0] for v in tied.trainable_variables}
    assert len(tied.trainable_variables) == len(untied.trainable_variables) - 1
    table = tied.get_layer("token_embedding").embeddings
    assert sum(v is table for v in tied.trainable_variables) == 1


def test_bad_model_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="vocabulary_size must be >= 2"):
        build_text_model("gru", 1, LENGTH, 0)
    with pytest.raises(ConfigError, match="sequence_length must be >= 2"):
        build_text_model("transformer", 50, 1, 0)


def test_ids_longer_than_the_position_table_are_refused() -> None:
    model = _model("transformer", False)
    vocab, lines = _vocab_and_lines()
    fits = vocab.encode_many(lines[:2], LENGTH + 1)  # the model reads LENGTH of them
    assert np.isfinite(float(next_token_loss(model, fits)))
    too_long = vocab.encode_many(lines[:2], LENGTH + 2)
    with pytest.raises(ConfigError, match=f"reads at most {LENGTH} tokens"):
        text_gradients(model, too_long)
    # The GRU has no position table: any length.
    assert np.isfinite(float(next_token_loss(_model("gru", False), too_long)))


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_the_raw_embedding_gradient_hands_over_the_tokens_and_fails_the_check(name: str) -> None:
    model = _model(name, False)
    ids = _ids(2)
    _, raw = raw_gradients(model, ids)
    sparse = raw[embedding_index(model)]
    assert isinstance(sparse, tf.IndexedSlices)
    # Its indices are the model's input ids, position by position: the sequence itself.
    np.testing.assert_array_equal(np.asarray(sparse.indices), ids[:, :-1].reshape(-1))
    with pytest.raises(TypeError, match=f"gradient {embedding_index(model)} is tf.IndexedSlices"):
        assert_dense(raw)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_the_shipped_client_sends_the_densified_gradient_exactly(name: str) -> None:
    model = _model(name, False)
    ids = _ids(2)
    raw_loss, raw = raw_gradients(model, ids)
    loss, dense = text_gradients(model, ids)
    assert_dense(dense)
    assert float(loss) == float(raw_loss)
    assert len(dense) == len(model.trainable_variables)
    for sent, kept, var in zip(dense, raw, model.trainable_variables, strict=True):
        assert not isinstance(sent, tf.IndexedSlices) and sent.shape == var.shape
        np.testing.assert_array_equal(np.asarray(sent), np.asarray(tf.convert_to_tensor(kept)))


def test_read_tokens_leaves_out_what_only_padding_follows() -> None:
    ids = np.array([[2, 9, 3, PAD, PAD], [2, 7, 8, 9, 10]])
    # Row 0 reads <bos>, 9 (its <eos> predicts padding); row 1 is cut, so 10 is a target only.
    assert read_tokens(ids).tolist() == [2, 7, 8, 9]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_bag_of_words_is_exact_on_untied_embeddings(name: str, batch: int) -> None:
    model = _model(name, False)
    ids = _ids(batch, start=40)
    _, dense = text_gradients(model, ids)
    recovered = bag_of_words(model, dense)
    truth = read_tokens(ids)
    assert len(truth) > batch + 1  # real words, not only <bos>
    assert bag_scores(recovered, truth) == (1.0, 1.0)
    np.testing.assert_array_equal(recovered, truth)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_bag_of_words_fails_on_tied_embeddings(name: str) -> None:
    model = _model(name, True)
    ids = _ids(4, start=40)
    _, dense = text_gradients(model, ids)
    recovered = bag_of_words(model, dense)
    precision, recall = bag_scores(recovered, read_tokens(ids))
    # The tied head sends gradient to every row: the rule claims the whole vocabulary.
    assert len(recovered) == model.get_layer("token_embedding").input_dim
    assert recall == 1.0 and precision < 0.1


def test_bag_scores_count_what_was_found() -> None:
    assert bag_scores([1, 2, 3, 4], [2, 4, 6]) == (0.5, 2 / 3)
    assert bag_scores([], []) == (1.0, 1.0)
