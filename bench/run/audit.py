"""Auditing your own Keras model from Python (a notebook, a training script): `audit`.

`audit` is the CLI's ``leakbench run`` behind a function that takes a Keras model and numpy
arrays. Its arguments become a config document (`audit_document`), which
`leakbench.run.config.build_run` builds into the run, as it does a config file's; the model and
the examples are kept where the run's ``config.toml`` names them (``inputs/model.keras`` and
``inputs/private.npz`` in the run directory), so that ``leakbench run`` on that file gives the
same trials. `leakbench.run.runner.run_benchmark` runs it: the planner, the store, the scoring
and the tables are the CLI's. With ``out`` the run directory stays and a second call with the
same arguments resumes it (finished trials are reused); without it the run lives in a temporary
directory that is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leakbench.core.errors import ConfigError
from leakbench.datasets._util import to_labels, to_unit_float
from leakbench.run.config import build_run
from leakbench.run.runner import run_benchmark

INPUTS = "inputs"
Component = str | Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What `audit` returns: the run's tables as DataFrames and a figure of reconstructions.

    Attributes:
        leaderboard: One row per (attack, defense) cell: leakage with intervals, the verdict.
        trials: One row per attacked image (``trials.csv``).
        utility: The trained accuracy per defense (empty unless ``training`` was given).
        figure: The originals and each defense's strongest-attack reconstructions (the
            ``reconstructions`` figure of ``leakbench figures``), or None if nothing was kept.
        out_dir: The run directory, or None when it was temporary.
        config: The TOML text of the config that ran; ``leakbench run`` on it gives the same
            trials.
        ran: Trials attacked by this call.
        reused: Trials found finished in ``out`` (a resumed audit).
    """

    leaderboard: pd.DataFrame
    trials: pd.DataFrame
    utility: pd.DataFrame
    figure: Any
    out_dir: Path | None
    config: str
    ran: int = 0
    reused: int = 0


def audit(
    model: Any,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    defenses: Sequence[Component] = ("none",),
    attacks: Sequence[Component] = ("idlg",),
    out: str | Path | None = None,
    batch_size: int = 1,
    seeds: Sequence[int] = (0,),
    public: tuple[np.ndarray, np.ndarray] | None = None,
    threat_model: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
    name: str = "audit",
    progress: bool = True,
    first_batch: int = 0,
    lpips: str | None = None,
    adaptive: bool = True,
    suite: str = "standard",
) -> AuditResult:
    """Attacks the gradients ``model`` would share on ``images`` under each defense.

    Args:
        model: A Keras classifier (logits or a softmax output) taking images of the shape of
            ``images``; or the path of a saved ``.keras`` file; or a zoo model's name.
        images: The private examples, N x H x W (grey) or N x H x W x C (C = 1 or 3), uint8
            0..255 or float in [0, 1]: every one is attacked.
        labels: Their integer labels, N of them, below the model's number of outputs.
        defenses: Defense names, or tables such as ``{"name": "gaussian", "sigma": 0.01}``
            (the keys of a ``[[defense]]`` table; a list value is a sweep).
        attacks: Attack names or ``[[attack]]`` tables, e.g. ``{"name": "ig", "restarts": 2}``.
        out: The run directory to write and to resume; None runs in a temporary directory.
        batch_size: Examples behind one shared gradient (N must be a multiple of it).
        seeds: The seeds of the run (each draws the order of the examples and the attacks'
            starting points; the model's weights are its own).
        public: Images and labels the server may hold (the dataset's other split): needed by
            a malicious server's attack and by ``training``, and the distractor pool of the
            identification test (`leakbench.components.leakage`) is drawn from them. Without
            it identification is off for the run (``identified`` empty, one warning line):
            every image given is attacked, so none is left for a pool that must never hold a
            private image; recovered and recognisable images still count as leaked.
        threat_model: The keys of ``[threat_model]``, e.g. ``{"labels_known": True}``.
        training: The keys of ``[training]`` (utility: training under each defense on
            ``public``); None leaves it out.
        name: The run's name.
        progress: Show a progress bar.
        first_batch: The batch index of the first batch of ``images`` (the config's
            ``first_batch``): with ``batch_size`` B, the images are batches ``first_batch``,
            ``first_batch + 1``, ... of each seed, and each batch's defense draw and attack start
            are those of its index. Round r of a federated deployment is batch r
            (`leakbench.integrations.flower_checkpoints.attack_checkpoint`).
        lpips: The LPIPS backbone of the scores (``"alex"``, ``"vgg"`` or ``"none"``); None
            keeps the config's default.
        adaptive: Whether each defense's adaptive attacks run too (the config's ``adaptive``).
        suite: ``"standard"`` (the attack suite of protocol 1 runs whatever ``attacks``
            lists, `leakbench.attacks.suite`) or ``"listed"`` (only ``attacks``; then a defense
            that stops them is ``untested``), the config's ``suite``.

    Returns:
        The leaderboard, the trials, the utility, a reconstruction figure and the config.

    Raises:
        ConfigError: A bad argument (one line naming it), or a config value the CLI refuses.
        DataError: Images or labels of the wrong shape, type or range.
    """
    x, y = to_unit_float(np.asarray(images), "images"), to_labels(np.asarray(labels), "labels")
    if len(x) != len(y):
        raise ConfigError(f"labels: {len(y)} labels for {len(x)} images")
    doc = audit_document(len(x), public is not None, defenses=defenses, attacks=attacks,
                         batch_size=batch_size, seeds=seeds, threat_model=threat_model,
                         training=training, name=name, first_batch=first_batch, lpips=lpips,
                         adaptive=adaptive, suite=suite)  # fmt: skip
    classes = _checked_classes(model, y, public)
    # Everything but the model and the data is checked before a file is written.
    build_run({**doc, "model": "lenet"})
    return _run_audit(model, doc, (x, y, public, classes), out, progress)


def audit_document(
    count: int,
    public: bool,
    *,
    defenses: Sequence[Component],
    attacks: Sequence[Component],
    batch_size: int,
    seeds: Sequence[int],
    threat_model: Mapping[str, Any] | None,
    training: Mapping[str, Any] | None,
    name: str,
    first_batch: int,
    lpips: str | None,
    adaptive: bool,
    suite: str,
) -> dict[str, Any]:
    """The config document of an `audit` of ``count`` examples (with ``public`` ones or not),
    without its ``dataset`` and ``model``; the other arguments are `audit`'s. A key that keeps
    its default is left out, so that an audit without it keeps its config and trial keys."""
    if count == 0:
        raise ConfigError("images: give at least one image")
    if not public and training is not None:
        raise ConfigError("training: needs public=(images, labels) to train on")
    if isinstance(seeds, int):
        raise ConfigError("seeds: give a list of seeds, e.g. [0]")
    doc: dict[str, Any] = {
        "name": name,
        "images": count,
        "batch_size": batch_size,
        "seeds": list(seeds),
        "attack": [_table(a, "attacks") for a in attacks],
        "defense": [_table(d, "defenses") for d in defenses],
        "training": {"enabled": False} if training is None else dict(training),
    }
    if first_batch:
        doc["first_batch"] = first_batch
    if lpips is not None:
        doc["lpips"] = lpips
    if adaptive is not True:
        doc["adaptive"] = adaptive
    if suite != "standard":
        doc["suite"] = suite
    if threat_model:
        doc["threat_model"] = dict(threat_model)
    if not public and doc.get("threat_model", {}).get("server") == "malicious":
        raise ConfigError(
            "public: a malicious server builds its model from public images; give "
            "public=(images, labels)"
        )
    return doc


def _run_audit(
    model: Any, doc: dict[str, Any], data: tuple[Any, ...], out: str | Path | None, progress: bool
) -> AuditResult:
    """Runs the audit of ``doc`` in ``out`` (a temporary directory for None), with the model
    and the examples ``data`` (images, labels, public, classes) kept in its ``inputs``."""
    x, y, public, classes = data
    temporary = tempfile.TemporaryDirectory(prefix="leakbench-audit-") if out is None else None
    folder = Path(temporary.name if temporary is not None else out)  # type: ignore[arg-type]
    try:
        inputs = folder / INPUTS
        arrays = _arrays(x, y, public, classes)
        held = inputs / "private.npz"
        _check_held(held, arrays)
        inputs.mkdir(parents=True, exist_ok=True)
        if not held.is_file():
            np.savez(held, **arrays)  # type: ignore[arg-type]
        where = {"dataset": f"npz:{held.resolve()}", "model": _model_value(model, inputs)}
        spec = build_run({**doc, **where})
        result = run_benchmark(spec, folder, progress=progress)
        return AuditResult(
            leaderboard=result.leaderboard,
            trials=result.trials,
            utility=result.utility,
            figure=_figure(folder),
            out_dir=None if temporary is not None else folder,
            config=spec.to_toml(),
            ran=result.ran,
            reused=result.reused,
        )
    finally:
        if temporary is not None:
            temporary.cleanup()


def _checked_classes(model: Any, y: np.ndarray, public: Any) -> int:
    """The model's number of outputs (for a zoo name: the labels' classes), refusing labels
    that it has no output for."""
    classes = _classes(model)
    labelled = [y] if public is None else [y, to_labels(np.asarray(public[1]), "public labels")]
    top = max(int(part.max()) for part in labelled if len(part))
    if classes is None:  # a zoo model is built for the labels' classes
        return max(top + 1, 2)
    if top >= classes:
        raise ConfigError(
            f"labels: the largest label is {top}, but the model has {classes} outputs"
        )
    return classes


def _table(component: Component, field: str) -> dict[str, Any]:
    if isinstance(component, str):
        return {"name": component}
    if isinstance(component, Mapping) and isinstance(component.get("name"), str):
        return dict(component)
    raise ConfigError(f"{field}: each entry is a name or a table with a 'name', got {component!r}")


def _classes(model: Any) -> int | None:
    """The number of outputs of ``model`` (a Keras model or a saved file), None for a zoo name."""
    import keras

    if isinstance(model, (str, Path)):
        text = _saved_name(model)
        if text is None:
            from leakbench.components.models import MODELS

            # An unknown name, or a text model (audit() attacks images), is refused now, in
            # one line with the names allowed.
            MODELS.get(str(model), "image")
            return None
        from leakbench.components.saved_models import saved_model_path

        model = keras.saving.load_model(saved_model_path(text), compile=False)
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"model: give a Keras model, a .keras path or a model name, got {type(model).__name__}"
        )
    outputs = getattr(model, "outputs", None)
    if not outputs:
        raise ConfigError(
            "model: has no defined outputs (a subclassed model); build it with the functional "
            "API or keras.Sequential"
        )
    return int(outputs[0].shape[-1])


def _saved_name(model: str | Path) -> str | None:
    """``keras:PATH`` for a saved model's path (with or without the prefix), None otherwise."""
    text = str(model)
    if text.startswith("keras:"):
        return text
    return f"keras:{text}" if text.endswith((".keras", ".h5")) else None


def _model_value(model: Any, inputs: Path) -> str:
    """The config's ``model`` value; a Keras model is saved to ``inputs/model.keras`` (kept if
    the file there already holds the same model, so that a resumed audit finds the same
    SHA-256 and reuses its trials)."""
    import keras

    if isinstance(model, (str, Path)):
        text = _saved_name(model)
        if text is None:
            return str(model)
        from leakbench.components.saved_models import saved_model_path

        return f"keras:{saved_model_path(text).resolve()}"
    path = inputs / "model.keras"
    if not (path.is_file() and _same_model(keras.saving.load_model(path, compile=False), model)):
        model.save(path)
    return f"keras:{path.resolve()}"


def _same_model(saved: Any, model: Any) -> bool:
    """Whether two Keras models have the same architecture and weights."""
    # The architecture, not the compile settings (an optimizer's state is not the model's).
    if json.dumps(saved.get_config(), sort_keys=True, default=str) != json.dumps(
        model.get_config(), sort_keys=True, default=str
    ):
        return False
    mine, theirs = saved.get_weights(), model.get_weights()
    return len(mine) == len(theirs) and all(
        a.shape == b.shape and np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True)
    )


def _arrays(
    x: np.ndarray, y: np.ndarray, public: tuple[np.ndarray, np.ndarray] | None, classes: int
) -> dict[str, np.ndarray]:
    """The archive's arrays: the private examples as its test split (the split attacked) and
    the public ones as its train split. Without public ones the train split repeats the
    private ones (an archive needs both splits); training and a malicious server need
    ``public``, and identification sees the repeated split and is turned off
    (`leakbench.run.identification.IDENTIFICATION_OFF`), so nothing reads them as public."""
    if public is None:
        train_x, train_y = x, y
    else:
        if not isinstance(public, tuple) or len(public) != 2:
            raise ConfigError("public: give a pair (images, labels)")
        train_x = to_unit_float(np.asarray(public[0]), "public images")
        train_y = to_labels(np.asarray(public[1]), "public labels")
        if len(train_x) != len(train_y):
            raise ConfigError(f"public: {len(train_y)} labels for {len(train_x)} images")
    return {
        "x": train_x,
        "y": train_y,
        "x_test": x,
        "y_test": y,
        "classes": np.array([str(c) for c in range(classes)]),
    }


def _check_held(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Refuses a run directory whose archive holds other examples: the store's keys name the
    examples by their position, so another set under the same directory would reuse the
    wrong trials."""
    if not path.is_file():
        return
    with np.load(path, allow_pickle=False) as held:
        same = set(held.files) == set(arrays) and all(
            held[k].shape == v.shape and np.array_equal(held[k], v) for k, v in arrays.items()
        )
    if not same:
        raise ConfigError(
            f"out: {path.parent.parent} holds an audit of other images; choose another directory"
        )


def _figure(folder: Path) -> Any:
    from leakbench.outputs.figures import load_run, reconstruction_grid
    from leakbench.outputs.plotting import FigureSkipped

    try:
        return reconstruction_grid(load_run(folder))
    except FigureSkipped:
        return None
