"""Saved Keras models as the attacked model (``model = "keras:PATH"``) and the models
entry-point group."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.cli import main
from leakbench.components.models import MODELS, build_model
from leakbench.components.saved_models import (
    check_every_weight_reached,
    load_saved_model,
    model_sha256,
)
from leakbench.core import plugins
from leakbench.core.errors import ConfigError
from leakbench.datasets import Dataset
from leakbench.run.config import parse_config
from leakbench.run.plan import plan
from leakbench.run.runner import run_benchmark

CONFIG = """\
name = "saved"
dataset = "digits"
model = "{model}"
suite = "listed"
images = {images}
batch_size = 1
seeds = [0]

[[attack]]
name = "idlg"
iterations = {iterations}

[[defense]]
name = "none"

[training]
enabled = false
"""
IDENTITY = ["seed", "batch_index", "position", "attack", "defense"]
NUMBERS = ["mse", "psnr", "label_acc", "iterations", "loss"]


def _run(model: str, out: Path, images: int = 2, iterations: int = 300) -> pd.DataFrame:
    spec = parse_config(CONFIG.format(model=model, images=images, iterations=iterations))
    return run_benchmark(spec, out, progress=False).trials


def _plain_keras_model(digits: Dataset) -> keras.Model:
    """A classifier as a Keras user writes one: sigmoid convolutions, a softmax head,
    compiled and fitted with Keras's own loop."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input(digits.input_shape),
            keras.layers.Conv2D(8, 3, padding="same", activation="sigmoid"),
            keras.layers.Flatten(),
            keras.layers.Dense(digits.num_classes, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(digits.train.x, digits.train.y, epochs=2, batch_size=64, verbose=0)
    return model


def test_a_saved_lenet_is_attacked_exactly_as_the_zoos(tmp_path: Path) -> None:
    """The zoo's LeNet at seed 0 saved to .keras and attacked as keras:PATH gives the trials of
    model = "lenet" at seed 0, number for number."""
    path = tmp_path / "lenet.keras"
    build_model("lenet", (8, 8, 1), 10, seed=0).save(path)
    zoo = _run("lenet", tmp_path / "zoo")
    saved = _run(f"keras:{path}", tmp_path / "saved")
    assert set(saved["model"]) == {f"keras:{path}"}
    pd.testing.assert_frame_equal(
        zoo.sort_values(IDENTITY)[NUMBERS].reset_index(drop=True),
        saved.sort_values(IDENTITY)[NUMBERS].reset_index(drop=True),
    )
    assert (saved["label_acc"] == 1.0).all() and (saved["psnr"] > 30).all()


def test_a_plain_keras_model_trained_with_fit_leaks_to_idlg(
    digits: Dataset, tmp_path: Path
) -> None:
    model = _plain_keras_model(digits)
    path = tmp_path / "mine.keras"
    model.save(path)
    trials = _run(f"keras:{path}", tmp_path / "out", iterations=500)
    # iDLG reads the label off the head's gradient and then matches the rest.
    assert (trials["label_acc"] == 1.0).all()
    assert (trials["psnr"] > 25).all(), trials["psnr"].tolist()
    # The model as loaded is the trained one: its weights are the file's, not a seed's.
    loaded = load_saved_model(f"keras:{path}", digits.input_shape, digits.num_classes)
    for mine, theirs in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_softmax_head_is_taken_off(digits: Dataset, tmp_path: Path) -> None:
    x = digits.test.x[:5]
    dense = _plain_keras_model(digits)
    trailing = keras.Sequential(
        [
            keras.Input(digits.input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
            keras.layers.Softmax(),
        ]  # fmt: skip
    )
    for name, model in (("dense", dense), ("trailing", trailing)):
        path = tmp_path / f"{name}.keras"
        model.save(path)
        logits = load_saved_model(f"keras:{path}", digits.input_shape, 10)(x)
        # The logits' softmax is the saved model's output.
        np.testing.assert_allclose(tf.nn.softmax(logits), model(x), rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(logits).sum(axis=1), 1.0)


def test_the_files_sha256_enters_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "lenet.keras"
    build_model("lenet", (8, 8, 1), 10, seed=0).save(path)
    spec = parse_config(CONFIG.format(model=f"keras:{path}", images=2, iterations=5))
    from leakbench.datasets import load_dataset

    keys = [t.key for t in plan(spec, load_dataset("digits"))]
    digest = model_sha256(f"keras:{path}")
    assert digest is not None and len(digest) == 64
    build_model("lenet", (8, 8, 1), 10, seed=1).save(path)  # other weights, the same path
    assert model_sha256(f"keras:{path}") != digest
    assert [t.key for t in plan(spec, load_dataset("digits"))] != keys
    # A zoo model's keys carry no digest: the default run's keys are unchanged.
    assert model_sha256("lenet") is None


@keras.saving.register_keras_serializable(package="leakbench_tests")
class _Doubling(keras.layers.Layer):
    """A custom layer registered here only: a fresh process cannot deserialise it."""

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return 2.0 * inputs


def _bad_models(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Each bad case: the model value and a piece of its one-line refusal."""

    def save(name: str, layers: list) -> str:
        path = tmp_path / f"{name}.keras"
        keras.Sequential([keras.Input((8, 8, 1)), *layers]).save(path)
        return f"keras:{path}"

    text = tmp_path / "notes.keras"
    text.write_text("not a model", encoding="utf-8")
    (tmp_path / "model.txt").write_text("not a model", encoding="utf-8")
    savedmodel = tmp_path / "exported"
    savedmodel.mkdir()
    (savedmodel / "saved_model.pb").write_bytes(b"")
    wrong_input = tmp_path / "wide.keras"
    keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    ).save(wrong_input)
    custom = save("custom", [keras.layers.Flatten(), _Doubling(), keras.layers.Dense(10)])
    return {
        "missing": (f"keras:{tmp_path / 'absent.keras'}", "no such file"),
        "suffix": (f"keras:{tmp_path / 'model.txt'}", "must be a .keras (or legacy .h5) file"),
        "not keras": (f"keras:{text}", "cannot be loaded as a Keras model"),
        "savedmodel": (f"keras:{savedmodel}", "SavedModel directory"),
        "input": (f"keras:{wrong_input}", "input shape (28, 28, 1) is not the dataset's (8, 8, 1)"),
        "classes": (
            save("seven", [keras.layers.Flatten(), keras.layers.Dense(7)]),
            "not one score per class of the dataset (10)",
        ),  # fmt: skip
        "sigmoid": (
            save("sigmoid", [keras.layers.Flatten(), keras.layers.Dense(10, activation="sigmoid")]),
            "activation is sigmoid",
        ),  # fmt: skip
        "frozen": (
            save("frozen", [keras.layers.Flatten(), keras.layers.Dense(10, trainable=False)]),
            "no trainable weights",
        ),  # fmt: skip
        "custom": (custom, "custom"),
    }


BAD = ["missing", "suffix", "not keras", "savedmodel", "input", "classes", "sigmoid", "frozen",
       "custom"]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_bad_saved_model_is_one_line_exit_2_and_nothing_written(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, needle = _bad_models(tmp_path)[case]
    if case == "custom":
        # As in a process that never imported the module defining the layer.
        monkeypatch.delitem(
            keras.saving.get_custom_objects(), "leakbench_tests>_Doubling", raising=True
        )
    config = tmp_path / "bad.toml"
    config.write_text(CONFIG.format(model=model, images=1, iterations=5), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"leakbench: error: model {model}: "), err[0]
    assert needle in err[0], err[0]
    assert not out.exists()


def test_the_models_entry_point_group_adds_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("lb_plugin_models")

    def tiny(input_shape: tuple[int, int, int], num_classes: int, seed: int) -> keras.Model:
        del seed
        return keras.Sequential(
            [keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)]
        )

    module.tiny = tiny  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lb_plugin_models", module)
    entry = importlib.metadata.EntryPoint(
        name="tiny_plugin_model", value="lb_plugin_models:tiny", group="leakbench.models"
    )
    assert "leakbench.models" in plugins.ENTRY_POINT_GROUPS
    try:
        plugins._load_entry(entry, plugins._attached["leakbench.models"])
        assert MODELS.get("tiny_plugin_model") is tiny
        assert build_model("tiny_plugin_model", (8, 8, 1), 10, seed=0).output_shape == (None, 10)
        spec = parse_config(CONFIG.format(model="tiny_plugin_model", images=1, iterations=5))
        assert spec.model == "tiny_plugin_model"
    finally:
        MODELS.unregister("tiny_plugin_model")


def test_load_saved_model_refuses_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model keras:: give the path"):
        load_saved_model("keras:", (8, 8, 1), 10)


def test_a_weight_the_loss_never_reaches_is_refused_by_name() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    variables = model.trainable_variables
    reached = [tf.zeros_like(v) for v in variables]
    check_every_weight_reached(model, reached, "model m")  # every weight has a gradient
    with pytest.raises(ConfigError) as caught:
        check_every_weight_reached(model, [*reached[:2], None, reached[3]], "model m")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model m: the loss gives no gradient to 1 ")
    assert f"(first: {variables[2].path})" in message
