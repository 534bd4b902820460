"""A user's own Keras text model in a text run (``model = "keras:PATH"``): the saved built-in
transformer recovers what the built-in one does, the file's hash enters the keys, the layers the
attacks read are found by type, and a file that does not fit is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
from cli_capture import run_cli

from leakbench.attacks.text.bag_of_words import BagOfWords, bag_of_words
from leakbench.attacks.text.forward import embedding_forward
from leakbench.attacks.text.span import SpanAttack, layout
from leakbench.components.text_models import build_text_model, embedding_index
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.modalities.text import text_gradients
from leakbench.run.config import parse_config
from leakbench.run.text import TextPipeline, plan_text, plan_text_training

WORDS, LENGTH = 200, 10

CONFIG = """\
name = "own-model"
dataset = "tinyshakespeare"
model = "{model}"
suite = "listed"
images = 2
seeds = [0]

[[attack]]
name = "bag_of_words"

[[attack]]
name = "span"

[[defense]]
name = "none"

[text]
sequence_length = {length}
max_words = {words}
batch_sizes = [1]
test_sentences = 20
train_epochs = 0
"""


def _vocabulary_size() -> int:
    return len(build_vocabulary(load_text_corpus("tinyshakespeare"), WORDS))


def _save(model: keras.Model, path: Path) -> str:
    model.save(path)
    return f"keras:{path}"


def _write(tmp: Path, model: str, *, length: int = LENGTH, name: str = "config.toml") -> Path:
    config = tmp / name
    config.write_text(CONFIG.format(model=model, length=length, words=WORDS), encoding="utf-8")
    return config


def test_a_saved_transformer_recovers_what_the_built_in_one_does(tmp_path: Path) -> None:
    size = _vocabulary_size()
    saved = _save(build_text_model("transformer", size, LENGTH, seed=0), tmp_path / "lm.keras")
    tables = {}
    for label, model in (("built", "transformer"), ("saved", saved)):
        config = _write(tmp_path, model, name=f"{label}.toml")
        result = run_cli("run", str(config), "--out", str(tmp_path / label), "--quiet")
        assert result.code == 0, result.err
        tables[label] = pd.read_csv(tmp_path / label / "trials.csv")
    built, own = tables["built"], tables["saved"]
    assert set(own["model"]) == {saved}
    assert len(own) == 4  # 2 sentences x 2 attacks, batch size 1
    same = ["attack", "sentence_index", "reconstruction", "text", "exact", "stop_reason"]
    pd.testing.assert_frame_equal(own[same], built[same])
    span = own[own["attack"] == "span"]
    assert (span["exact"] == 1).all() and (span["stop_reason"] == "exact").all()
    bag = own[own["attack"] == "bag_of_words"]
    assert (bag["bag_precision"] == 1.0).all()  # every word found is one of the batch's


def test_the_file_hash_is_in_the_keys_and_built_in_keys_hold_none(tmp_path: Path) -> None:
    size = _vocabulary_size()
    path = tmp_path / "lm.keras"
    saved = _save(build_text_model("gru", size, LENGTH, seed=0), path)
    spec = parse_config(_write(tmp_path, saved).read_text(encoding="utf-8"))
    pipeline = TextPipeline(spec)
    data = pipeline.load()
    trials, trainings = pipeline.plan(data), pipeline.trainings(data)
    before = [t.key for t in trials]
    assert trials[0].setting.model_sha256 is not None
    _save(build_text_model("gru", size, LENGTH, seed=1), path)  # same path, new weights
    after = [t.key for t in plan_text(spec, 2 + spec.text.test_sentences)]
    assert not set(before) & set(after)
    built = parse_config(_write(tmp_path, "gru", name="built.toml").read_text(encoding="utf-8"))
    assert plan_text_training(built) == [] and trainings == []
    assert all(t.setting.model_digest() == {} for t in plan_text(built, 22))


def _own_gru(size: int) -> keras.Model:
    """A GRU LM of other names than the built-in one's (the attacks find layers by type)."""
    ids = keras.Input(shape=(None,), dtype="int32")
    vectors = keras.layers.Embedding(size, 16, name="words")(ids)
    states = keras.layers.GRU(16, return_sequences=True, name="recurrent")(vectors)
    return keras.Model(ids, keras.layers.Dense(size, name="logits")(states), name="own_gru")


def test_the_attacks_find_their_layers_by_type() -> None:
    size = 30
    model = _own_gru(size)
    assert layout(model).kind == "gru" and layout(model).gru is model.get_layer("recurrent")
    assert embedding_index(model) == 0  # the Embedding's table, whatever its name
    ids = np.array([[2, 7, 9, 11, 3, 0]], np.int32)
    _, grads = text_gradients(model, ids)
    # The rows of the embedding gradient that are not zero are the inputs the loss reads: the
    # model reads 2 7 9 11 3 and is scored on 7 9 11 3 <pad>; the <pad> target is not counted,
    # so the input 3 before it reaches no loss.
    assert bag_of_words(model, grads).tolist() == [2, 7, 9, 11]
    BagOfWords().check_model(model)
    embedding_forward(model)  # what tag needs: the model from its embedding's output on
    SpanAttack().check_model(model)
    flat = keras.Sequential(
        [keras.Input((None,), dtype="int32"), keras.layers.Embedding(size, 8)]
        + [keras.layers.Dense(size)]
    )
    with pytest.raises(ConfigError, match="span: needs two keras.layers.MultiHeadAttention"):
        SpanAttack().check_model(flat)
    BagOfWords().check_model(flat)  # bag of words needs only the Embedding


def _image_model() -> keras.Model:
    return keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )


def _fixed_length(size: int) -> keras.Model:
    ids = keras.Input(shape=(5,), dtype="int32")
    vectors = keras.layers.Embedding(size, 8)(ids)
    return keras.Model(ids, keras.layers.Dense(size)(vectors))


BAD = [
    ("wrong-vocabulary", "vocabulary", LENGTH, "text.max_words: model keras:"),
    ("fixed-length", "fixed", LENGTH, "text.sequence_length: model keras:"),
    ("image-model-in-a-text-run", "image", LENGTH, "is not token ids [B, L] (an image model?)"),
    ("no-attention-for-span", "flat", LENGTH, "span: needs two keras.layers.MultiHeadAttention"),
]


@pytest.mark.parametrize(
    ("kind", "length", "needle"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_a_file_that_does_not_fit_is_one_line_exit_2(
    tmp_path: Path, kind: str, length: int, needle: str
) -> None:
    size = _vocabulary_size()
    models = {
        "vocabulary": lambda: build_text_model("transformer", size + 1, LENGTH, seed=0),
        "fixed": lambda: _fixed_length(size),
        "image": _image_model,
        "flat": lambda: keras.Sequential(
            [keras.Input((None,), dtype="int32"), keras.layers.Embedding(size, 8)]
            + [keras.layers.Dense(size)]
        ),
    }
    saved = _save(models[kind](), tmp_path / "model.keras")
    config = _write(tmp_path, saved, length=length)
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 2, result
    assert len(result.err.splitlines()) == 1 and result.err.startswith("leakbench: error: ")
    assert needle in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_a_text_model_file_in_an_image_run_is_one_line_exit_2(tmp_path: Path) -> None:
    saved = _save(build_text_model("gru", 40, LENGTH, seed=0), tmp_path / "lm.keras")
    config = tmp_path / "image.toml"
    config.write_text(
        f'name = "image"\ndataset = "digits"\nmodel = "{saved}"\nimages = 1\n'
        'suite = "listed"\n\n[[attack]]\nname = "idlg"\n\n[[defense]]\nname = "none"\n',
        encoding="utf-8",
    )
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 2, result
    assert len(result.err.splitlines()) == 1
    assert "is a text model (token ids [B, L] -> next-token logits)" in result.err, result.err


@pytest.mark.parametrize("setting", ["tie_embeddings", "freeze_embeddings"])
def test_a_saved_model_keeps_its_own_layers(tmp_path: Path, setting: str) -> None:
    saved = _save(build_text_model("gru", 40, LENGTH, seed=0), tmp_path / "lm.keras")
    text = _write(tmp_path, saved).read_text(encoding="utf-8") + f"{setting} = true\n"
    with pytest.raises(ConfigError, match=rf"^text\.{setting}: model keras:.* is a saved model"):
        parse_config(text)
