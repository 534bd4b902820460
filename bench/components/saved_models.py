"""Saved Keras models as the attacked model: ``model = "keras:PATH"``.

A user audits their own classifier (or, in a text run, their own language model:
`load_text_model`, docs/text.md) by pointing the config at the file Keras saved it to
(``model.save("model.keras")``, or the legacy ``.h5``). The model is loaded with its trained
weights and attacked as it is; `load_saved_model` checks that it is a classifier the attacks
can use, and every problem is one line naming the file (`ConfigError`, exit code 2):

* the file is missing, not a Keras archive, or a SavedModel directory (Keras 3 cannot rebuild
  a trainable model from one);
* a ``.keras`` archive would inflate beyond `MAX_MODEL_BYTES`, or one of its members inflates
  more than `MAX_MEMBER_RATIO` times (a decompression bomb), read from the zip directory
  before Keras opens the file;
* a layer cannot be deserialised (a custom layer whose class is not registered with
  ``keras.saving.register_keras_serializable`` in an imported module);
* it has more than one input, or its input shape is not the dataset's (after ``image_size``);
* its output is not one vector of the dataset's classes, as logits or a softmax;
* it has no trainable weights, or the client's loss gives no gradient to one of them.

A softmax head is taken off (the last layer's activation set to linear, or a trailing
``Softmax`` layer dropped): leakbench's loss (`leakbench.components.forward.task_loss`) is the
cross-entropy of logits, which is what the same model trained with a softmax and
``categorical_crossentropy`` differentiates too. BatchNorm and dropout follow
`leakbench.components.forward.forward_training`: batch statistics, and dropout masks drawn from
the model's own seed state, the same for the client and the attacker (an attacker who knows
the masks, the stronger one).

The file's SHA-256 (`model_sha256`) enters every trial and training key, so editing the file
under the same path never reuses results computed from the old weights.
"""

from __future__ import annotations

import functools
import hashlib
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leakbench.core.errors import ConfigError

PREFIX = "keras:"
SUFFIXES = (".keras", ".h5")
# The most a .keras archive may inflate to (all members together): 2 GiB holds 500 million
# float32 weights, far beyond the models that gradient inversion attacks here (ResNet-18 is
# 45 MB), and Keras reads the weights member into memory whole.
MAX_MODEL_BYTES = 2 * 2**30
# Keras stores archive members uncompressed (ratio 1) and deflate cannot exceed about 1032 to
# 1, so a member above `MIN_BOMB_BYTES` that inflates more than this many times its stored size
# is a bomb, not a saved model (Keras's own guard starts at 4 GiB, above `MAX_MODEL_BYTES`).
MAX_MEMBER_RATIO = 100
MIN_BOMB_BYTES = 2**26
# What keras.saving.load_model raises on a damaged, foreign or undeserialisable file: a
# missing custom class is a TypeError, a malformed config a ValueError or KeyError.
_LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, AttributeError, zipfile.BadZipFile)


def is_saved_model(name: str) -> bool:
    """Whether a config's ``model`` names a saved file (``keras:PATH``) rather than the zoo."""
    return name.startswith(PREFIX)


def saved_model_path(name: str) -> Path:
    """The checked path of ``keras:PATH``: an existing ``.keras`` or ``.h5`` file (``~``
    expanded; a relative PATH is the working directory's, and a config file's relative PATH was
    made absolute against the config's folder when it was read).

    Raises:
        ConfigError: The path is empty, missing, a directory or of another kind.
    """
    text = name[len(PREFIX) :]
    where = f"model {name}"
    if not text:
        raise ConfigError(f"{where}: give the path of a saved model after 'keras:'")
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            raise ConfigError(
                f"{where}: is a TensorFlow SavedModel directory, which Keras 3 cannot load as a "
                'trainable model; save the model with model.save("model.keras")'
            )
        raise ConfigError(f"{where}: is a directory, not a saved .keras file")
    if not path.is_file():
        if path.is_absolute():
            raise ConfigError(f"{where}: no such file")
        # A config file's relative path was made absolute against its folder when it was read
        # (`leakbench.run.config.load_config`); one given in Python is the working directory's.
        raise ConfigError(
            f"{where}: no such file {Path.cwd() / path} (a relative path given here is read "
            "from the working directory; in a config file, from the config's folder)"
        )
    if path.suffix not in SUFFIXES:
        raise ConfigError(
            f"{where}: must be a .keras (or legacy .h5) file, got {path.suffix or 'no suffix'}"
        )
    if path.suffix == ".keras":
        _check_archive(path, where)
    return path


def _check_archive(path: Path, where: str) -> None:
    """Refuses a ``.keras`` file that is not a zip archive or would inflate too far, from its
    zip directory alone (nothing is inflated).

    Raises:
        ConfigError: One line naming ``where``: what the file is, or the sizes and the limit.
    """
    cannot = f"{where}: cannot be loaded as a Keras model"
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile:
        raise ConfigError(
            f"{cannot} (not a zip archive, which a .keras file is; save the model with "
            'model.save("model.keras"))'
        ) from None
    except OSError as err:
        raise ConfigError(f"{cannot} ({' '.join(str(err).split())})") from None
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > MIN_BOMB_BYTES and ratio > MAX_MEMBER_RATIO:
            raise ConfigError(
                f"{cannot}: member {member.filename!r} inflates {member.compress_size} bytes to "
                f"{member.file_size} ({ratio:.0f} times; at most {MAX_MEMBER_RATIO} above "
                f"{MIN_BOMB_BYTES // 2**20} MiB), a likely decompression bomb"
            )
    total = sum(member.file_size for member in members)
    if total > MAX_MODEL_BYTES:
        raise ConfigError(
            f"{cannot}: it inflates to {total / 2**30:.3g} GiB, above the limit of "
            f"{MAX_MODEL_BYTES // 2**30} GiB"
        )


def model_sha256(name: str) -> str | None:
    """The SHA-256 of a saved model's file, None for a zoo model."""
    if not is_saved_model(name):
        return None
    return _sha256(saved_model_path(name).resolve())


@functools.lru_cache(maxsize=32)
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256_of(path, stat.st_size, stat.st_mtime_ns)


def load_saved_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """Loads ``keras:PATH`` as a model of logits for images of ``input_shape``, checked.

    Each call returns a new model with the file's weights (a run trains its own copies).

    Raises:
        ConfigError: One line naming the file and the problem (the module docstring's list).
    """
    return check_classifier(_load(name), input_shape, num_classes, f"model {name}")


def load_text_model(name: str, vocabulary_size: int, sequence_length: int) -> Any:
    """Loads ``keras:PATH`` as a text run's model: token ids [B, L - 1] -> next-token logits
    [B, L - 1, V], checked (`check_text_model`). Each call returns a new model with the file's
    weights.

    Raises:
        ConfigError: One line naming the file (and the ``[text]`` field where one fits).
    """
    return check_text_model(_load(name), vocabulary_size, sequence_length, f"model {name}")


def _load(name: str) -> Any:
    """The Keras model of the file ``keras:PATH``, unchecked."""
    import keras

    path = saved_model_path(name)
    where = f"model {name}"
    try:
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    except _LOAD_ERRORS as err:
        reason = " ".join(str(err).split())
        if "custom" in reason.lower() or "register_keras_serializable" in reason:
            hint = (
                "; a custom layer must be registered with keras.saving."
                "register_keras_serializable in a module imported before the run"
            )
        else:
            hint = ""
        raise ConfigError(
            f"{where}: cannot be loaded as a Keras model ({_shorten(reason)}){hint}"
        ) from None
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{where}: holds a {type(model).__name__}, not a Keras model")
    return model


def check_classifier(
    model: Any, input_shape: tuple[int, int, int], num_classes: int, where: str
) -> Any:
    """``model`` as a model of logits, after checking that the attacks can use it (the module
    docstring's list); raises `ConfigError` naming ``where`` otherwise."""
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConfigError(
            f"{where}: has no defined input (a subclassed model); build it with the functional "
            "API or keras.Sequential"
        )
    if len(inputs) != 1:
        raise ConfigError(f"{where}: has {len(inputs)} inputs; the attacks need one image input")
    shape = tuple(inputs[0].shape[1:])
    if len(shape) == 1:
        raise ConfigError(
            f"{where}: is a text model (token ids [B, L] -> next-token logits); an image run "
            f"needs images {_shape(input_shape)} -> class scores (a text model's dataset is a "
            "text corpus: tinyshakespeare or text:PATH)"
        )
    if shape != tuple(input_shape):
        raise ConfigError(
            f"{where}: its input shape {_shape(shape)} is not the dataset's {_shape(input_shape)} "
            "(set image_size, or use the dataset the model was trained on)"
        )
    model = _logits(model, where)
    out_shape = tuple(model.outputs[0].shape[1:]) if len(model.outputs) == 1 else None
    if out_shape != (num_classes,):
        raise ConfigError(
            f"{where}: its output {_shape(out_shape) if out_shape else 'is not one tensor'} is "
            f"not one score per class of the dataset ({num_classes})"
        )
    if not model.trainable_variables:
        raise ConfigError(f"{where}: has no trainable weights; there is no gradient to share")
    from leakbench.components.forward import stateless_forward, task_loss

    # A stateless pass, as every gradient of a run: the probe leaves BatchNorm's statistics.
    x = tf.zeros((2, *input_shape))
    y = tf.one_hot([0, 1 % num_classes], num_classes)
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        loss = task_loss(stateless_forward(model, x, trainable)[0], y)
    grads = tape.gradient(loss, trainable)
    check_every_weight_reached(model, grads, where)
    return model


def check_text_model(model: Any, vocabulary_size: int, sequence_length: int, where: str) -> Any:
    """``model`` as a text model of logits, after checking the text contract (docs/text.md):
    one input of token ids [B, T] (T free or L - 1: the client feeds the first L - 1 ids of
    each sequence), one output of logits [B, T, V] with V the run's vocabulary size, and a
    gradient for every trainable weight. Raises `ConfigError` naming ``where`` (and
    ``text.sequence_length`` or ``text.max_words`` where those are what differs)."""
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1:
        raise ConfigError(
            f"{where}: needs one input of token ids [B, L]; build it with the functional API "
            "or keras.Sequential"
        )
    shape = tuple(inputs[0].shape[1:])
    if len(shape) != 1:
        raise ConfigError(
            f"{where}: its input {_shape(shape)} is not token ids [B, L] (an image model?); a "
            "text run needs a model of token ids [B, L] -> next-token logits [B, L, V]"
        )
    reads = sequence_length - 1
    if shape[0] is not None and shape[0] != reads:
        raise ConfigError(
            f"text.sequence_length: {where} reads {shape[0]} ids at a time and a run feeds it "
            f"sequence_length - 1; set it to {shape[0] + 1} (or save the model with "
            f"Input(shape=(None,))), got {sequence_length}"
        )
    model = _logits(model, where)
    out = tuple(model.outputs[0].shape[1:]) if len(model.outputs) == 1 else None
    if out is None or len(out) != 2 or out[0] not in (None, shape[0]):
        raise ConfigError(
            f"{where}: its output {_shape(out) if out else 'is not one tensor'} is not "
            "next-token logits [B, L, V] (one score per vocabulary id at every position)"
        )
    if out[1] != vocabulary_size:
        raise ConfigError(
            f"text.max_words: {where} gives {out[1]} logits per position but the run's "
            f"vocabulary has V = {vocabulary_size} ids (4 special ids and max_words words); "
            "the model must be built for the run's vocabulary"
        )
    if not model.trainable_variables:
        raise ConfigError(f"{where}: has no trainable weights; there is no gradient to share")
    ids = tf.ones((2, max(reads, 1)), tf.int32)
    with tf.GradientTape() as tape:
        logits = model(ids, training=False)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits)
        )
    grads = tape.gradient(loss, model.trainable_variables)
    check_every_weight_reached(model, grads, where)
    return model


def _logits(model: Any, where: str) -> Any:
    """The model with a softmax head taken off; a head of another activation is refused."""
    import keras

    last = model.layers[-1] if model.layers else None
    if isinstance(last, keras.layers.Softmax) or (
        isinstance(last, keras.layers.Activation) and _activation_name(last.activation) == "softmax"
    ):
        return keras.Model(model.inputs[0], last.input, name=model.name)
    activation = _activation_name(getattr(last, "activation", None))
    if activation == "softmax" and last is not None:
        last.activation = keras.activations.linear
    elif activation not in (None, "linear"):
        raise ConfigError(
            f"{where}: its last layer's activation is {activation}; the attacks need logits or "
            "a softmax"
        )
    return model


def _activation_name(activation: Any) -> str | None:
    return None if activation is None else getattr(activation, "__name__", str(activation))


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_every_weight_reached(model: Any, grads: Sequence[Any], where: str) -> None:
    """Refuses (one line naming ``where``) a model with a trainable weight whose gradient
    ``grads`` (ordered like ``model.trainable_variables``) is None: the loss never reaches it."""
    missing = [v.path for v, g in zip(model.trainable_variables, grads, strict=True) if g is None]
    if missing:
        raise ConfigError(
            f"{where}: the loss gives no gradient to {len(missing)} trainable weight(s) "
            f"(first: {missing[0]}); freeze them (layer.trainable = False) before saving"
        )
