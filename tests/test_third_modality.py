"""A third modality from one file: fixed-length rows of floats with a class label.

`PLUGIN` is the whole modality, written as a researcher would write it in one module of their
own package: its dataset (a seeded synthetic pool, no download), a tiny Keras model, one attack
of the shared contract (`leakbench.attacks.base.AttackContract`) and its pipeline
(`leakbench.run.pipeline.Pipeline`, registered in `PIPELINES` as ``rows``). The module is saved
in a temporary folder put on the import path (``PYTHONPATH`` too, so that the worker processes
of ``--workers 2`` import it), and a config names it by its module name (the board imports no
plugin file a submission names, only an installed module).

The attack reads the private row from the first dense layer's gradients: for one row ``x``,
the kernel's gradient is ``x`` times the bias's (``dW = x db^T``), so ``x = dW[:, j] / db[j]``
for any unit ``j`` whose bias gradient is not zero. Undefended it recovers every row to float
precision; under Gaussian noise of sigma 1 it recovers none.

The same config then goes through every command of the one pipeline: ``leakbench run``, the
same run on two worker processes, two shards merged, ``rescore`` and ``board``; each gives the
tables of the plain run (timings aside), and the board lists the run's rows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from cli_capture import run_cli

from leakbench.attacks import ATTACKS
from leakbench.components.models import MODELS
from leakbench.datasets import DATASETS
from leakbench.run.pipeline import PIPELINES

PLUGIN = '''\
"""Rows: fixed-length float rows with a class label, a third modality in one module."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks.base import (
    ATTACKS, RETRIES, AttackContract, Tally, build_attack, check_gradients,
)
from leakbench.client.update import observer
from leakbench.components.leakage import exact_interval
from leakbench.components.models import MODELS
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.params import param
from leakbench.core.seeds import attack_seed, observed_draw, private_indices
from leakbench.datasets import DATASETS
from leakbench.modalities import IMAGE
from leakbench.outputs.leak_flags import CELL_COLUMNS
from leakbench.outputs.tables import strongest_attack
from leakbench.run.grid import expand
from leakbench.run.pipeline import PIPELINES, Pipeline
from leakbench.run.plan import Setting, plan_batches

MODALITY = "rows"
FEATURES, CLASSES = 6, 3
# A row is recovered (leaked) when no feature is further than this from the truth.
RECOVERED = 1e-4


@dataclasses.dataclass(frozen=True)
class Rows:
    """A public pool (the attacker's prior data) and a private pool (what trials attack)."""

    public: np.ndarray
    private: np.ndarray
    private_labels: np.ndarray
    num_classes: int


@DATASETS.register("toy_rows", modality=MODALITY)
def toy_rows() -> Rows:
    """Sixteen seeded rows of 6 features in [0, 1] and 3 classes, half of them private."""
    rng = np.random.default_rng(2024)
    x = rng.random((16, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, 16).astype(np.int64)
    return Rows(x[:8], x[8:], y[8:], CLASSES)


@MODELS.register("row_mlp", modality=MODALITY)
def row_mlp(input_shape: tuple[int, ...], num_classes: int, seed: int) -> keras.Model:
    """Dense(8, tanh), then Dense(classes): logits of a row."""
    inputs = keras.Input(shape=input_shape)
    hidden = keras.layers.Dense(
        8, activation="tanh", name="first",
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
        bias_initializer=keras.initializers.RandomNormal(stddev=0.1, seed=seed + 1),
    )(inputs)
    logits = keras.layers.Dense(
        num_classes, name="head", kernel_initializer=keras.initializers.GlorotUniform(seed + 2)
    )(hidden)
    return keras.Model(inputs, logits, name="row_mlp")


@dataclasses.dataclass(frozen=True)
class RowsTarget:
    """What the server sees: the model it sent and the client's defended gradient."""

    model: keras.Model
    gradients: tuple[tf.Tensor, ...]
    batch_size: int
    features: int


@dataclasses.dataclass(frozen=True)
class RowsResult:
    """One attempt: the rows, the attacker's own residual, why it stopped."""

    rows: np.ndarray
    loss: float
    stop_reason: str
    iterations_used: int
    budget: int
    note: str = ""


@dataclasses.dataclass(frozen=True)
class RowsReconstruction:
    """A rows attack's result (what the final ``__call__`` returns)."""

    rows: np.ndarray
    loss: float
    stop_reason: str
    iterations_used: int
    budget: int
    note: str
    status: str
    message: str
    attempts: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class RowsAttack(AttackContract[RowsTarget, RowsResult, RowsReconstruction]):
    """The rows attacks' base: `run` is one attempt on one target."""

    modality: ClassVar[str] = MODALITY
    max_batch_size: ClassVar[int] = 1

    def check_model(self, model: keras.Model) -> None:
        del model

    def run(self, target: RowsTarget, seed: tf.Tensor) -> RowsResult:
        raise NotImplementedError

    def run_many(self, targets: list[RowsTarget], seeds: list[tf.Tensor]) -> list[RowsResult]:
        return [self.run(t, s) for t, s in zip(targets, seeds, strict=True)]

    def _check_target(self, target: RowsTarget) -> None:
        check_gradients(target.model, target.gradients)
        self.check_model(target.model)

    def _finite(self, target: RowsTarget, output: RowsResult) -> bool:
        return bool(np.all(np.isfinite(output.rows)))

    def _result(self, target: RowsTarget, tally: Tally[RowsResult]) -> RowsReconstruction:
        shape = (target.batch_size, target.features)
        out = tally.kept or RowsResult(np.zeros(shape, np.float32), math.nan, "exact", 0, 0)
        ok = tally.status == "ok"
        return RowsReconstruction(
            np.nan_to_num(out.rows).reshape(shape), out.loss,
            out.stop_reason if ok else tally.status, out.iterations_used, out.budget,
            out.note if ok else tally.message, tally.status, tally.message, tally.attempts,
            tally.seconds,
        )


@ATTACKS.register("first_layer")
@dataclasses.dataclass(frozen=True)
class FirstLayer(RowsAttack):
    """The row from the first dense layer's gradients: x = dW[:, j] / db[j] (exact for one
    row), j the unit of the largest |db|; its loss is the residual |dW - x db^T| / |dW|."""

    name: ClassVar[str] = "first_layer"

    retries: int = param(0, RETRIES, doc="fresh starts (nothing is drawn)")

    def check_model(self, model: keras.Model) -> None:
        first = model.layers[1] if len(model.layers) > 1 else None
        if not isinstance(first, keras.layers.Dense) or first.bias is None:
            raise ConfigError(f"attack {self.name}: model {model.name} opens on no biased Dense")

    def run(self, target: RowsTarget, seed: tf.Tensor) -> RowsResult:
        del seed  # analytic: nothing is drawn
        kernel = np.asarray(target.gradients[0], np.float64)
        bias = np.asarray(target.gradients[1], np.float64)
        unit = int(np.argmax(np.abs(bias)))
        row = kernel[:, unit] / bias[unit]
        residual = np.linalg.norm(kernel - np.outer(row, bias)) / np.linalg.norm(kernel)
        rows = np.repeat(row[None, :], target.batch_size, axis=0).astype(np.float32)
        return RowsResult(rows, float(residual), "exact", 1, 1)


TRIAL_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_index", "batch_size", "position", "row_index", "label", "row_mse", "max_error",
    "leaked", "loss", "status", "stop_reason", "iterations_used", "budget", "note", "seconds",
]
BOARD_COLUMNS = [
    *CELL_COLUMNS, "n", "row_mse_mean", "max_error_mean", "leaked_rate", "leaked_low",
    "leaked_high", "seconds_mean", "strongest", "protocol",
]


@PIPELINES.register(MODALITY)
class RowsPipeline(Pipeline):
    """A rows run: every listed attack against every defense, on each private batch."""

    modality = MODALITY
    trial_columns = TRIAL_COLUMNS
    utility_columns = ["run", "dataset", "model", "defense", "defense_params", "seed"]

    def load(self) -> Rows:
        return DATASETS.get(self.spec.dataset, MODALITY)()

    def attacks(self) -> list[RowsAttack]:
        return [build_attack(MODALITY, c.name, p)
                for c in self.spec.attacks for p in expand(c.params)]

    def model(self, data: Rows, seed: int) -> keras.Model:
        build = MODELS.get(self.spec.model, MODALITY)
        return build((data.private.shape[1],), data.num_classes, seed)

    def check(self, data: Rows, trials: list[Any]) -> None:
        probe = self.model(data, self.spec.seeds[0])
        for attack in self.attacks():
            attack.check_model(probe)
            if self.spec.batch_size > attack.max_batch_size:
                raise ConfigError(f"attack {attack.name}: batch_size must be 1 (one row)")

    def plan(self, data: Rows) -> list[Any]:
        spec, pool = self.spec, len(data.private)
        if spec.images > pool:
            raise ConfigError(f"images must be at most the {pool} private rows")
        cells = [(defense, self.attacks()) for defense in spec.defense_grid()]
        draw = lambda seed: private_indices(pool, spec.images, seed)  # noqa: E731
        setting = Setting.of(spec, kind=MODALITY)
        return plan_batches(setting, spec.seeds, draw, [spec.batch_size], cells,
                            first=spec.first_batch)

    def groups(self, trials: list[Any]) -> list[list[Any]]:
        """One group per private batch, every defense and attack on it."""
        groups: dict[tuple[int, int], list[Any]] = {}
        for trial in trials:
            groups.setdefault((trial.seed, trial.batch_index), []).append(trial)
        return list(groups.values())

    def cache(self, data: Rows, folder: Any = None, progress: bool = False) -> dict[Any, Any]:
        return {}

    def observe(self, data: Rows, cache: dict[Any, Any], trial: Any) -> RowsTarget:
        """The target of ``trial``'s batch under its defense: the model of its seed, the
        client's defended gradient. The client's step is the image modality's (`IMAGE`): a
        cross-entropy of logits against label distributions, its batch gradient, the defense
        on it; nothing in it reads an image, so rows need no `Modality` of their own."""
        if trial.seed not in cache:
            cache[trial.seed] = self.model(data, trial.seed)
        model = cache[trial.seed]
        name = (trial.seed, canonical_json([trial.defense.name, trial.defense.params()]))
        if name not in cache:
            cache[name] = observer(trial.defense, model, None, IMAGE)
        rows = tf.constant(data.private[list(trial.indices)])
        labels = tf.one_hot(data.private_labels[list(trial.indices)], data.num_classes)
        update = cache[name](rows, labels, observed_draw(trial.seed, trial.batch_index))
        return RowsTarget(model, tuple(update), len(trial.indices), data.private.shape[1])

    def attack(self, data: Rows, group: list[Any], cache: dict[Any, Any], skip: Any = (),
               checkpoint: Any = None) -> tuple[list[Any], dict[str, bytes]]:
        items = []
        for trial in group:
            if trial.key in skip:
                continue
            target = self.observe(data, cache, trial)
            result = trial.attack(target, seed=attack_seed(trial.seed, trial.batch_index))
            items.append((trial.key, self.rows(data, trial, result)))
        return items, {}

    def rows(self, data: Rows, trial: Any, result: RowsReconstruction) -> list[dict[str, Any]]:
        """The stored rows of one trial: each private row's errors and the attack's record."""
        out = []
        for position, index in enumerate(trial.indices):
            error = np.abs(result.rows[position].astype(np.float64) - data.private[index])
            out.append({
                **trial.columns(), "position": position, "row_index": index,
                "label": int(data.private_labels[index]),
                "row_mse": float(np.mean(error**2)), "max_error": float(error.max()),
                "leaked": int(error.max() <= RECOVERED), "loss": float(result.loss),
                "status": result.status, "stop_reason": result.stop_reason,
                "iterations_used": int(result.iterations_used), "budget": int(result.budget),
                "note": result.note, "seconds": float(result.seconds),
            })
        return out

    def leaderboard(self, trials: pd.DataFrame, utility: pd.DataFrame, audit: Any) -> Any:
        """One row per cell: its rows, their mean errors and the share leaked with its exact
        95% interval; the strongest attack of each defense marked."""
        cells = []
        for cell, group in trials.groupby(CELL_COLUMNS, sort=False):
            leaked = int(group["leaked"].sum())
            low, high = exact_interval(leaked, len(group))
            cells.append({
                **dict(zip(CELL_COLUMNS, cell, strict=True)), "n": len(group),
                "row_mse_mean": float(group["row_mse"].mean()),
                "max_error_mean": float(group["max_error"].mean()),
                "leaked_rate": leaked / len(group), "leaked_low": low, "leaked_high": high,
                "seconds_mean": float(group["seconds"].mean()),
            })
        board = pd.DataFrame(cells, columns=BOARD_COLUMNS)
        keys = ["dataset", "model", "defense", "defense_params"]
        board["strongest"] = strongest_attack(board, (), keys)
        board["protocol"] = self.spec.protocol
        return board
'''

CONFIG = """\
plugins = ["toy_rows"]
name = "rows"
dataset = "toy_rows"
model = "row_mlp"
suite = "listed"
images = 4
seeds = [0]

[[attack]]
name = "first_layer"

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = 1.0
"""

TABLES = ("trials.csv", "utility.csv", "leaderboard.csv")


def _table(run: Path, name: str) -> pd.DataFrame:
    """A table less its timing columns (``seconds``, the leaderboard's ``seconds_mean``)."""
    frame = pd.read_csv(run / name)
    return frame.drop(columns=[c for c in frame.columns if c.startswith("seconds")])


def _same_tables(run: Path, whole: Path) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(_table(run, name), _table(whole, name))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working folder with the config and, in ``site/``, the plugin module on the import
    path of this process and of the worker processes; what it registers is unregistered
    after the module's tests."""
    root = tmp_path_factory.mktemp("rows")
    site = root / "site"
    site.mkdir()
    (site / "toy_rows.py").write_text(PLUGIN, encoding="utf-8")
    (root / "config.toml").write_text(CONFIG, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        held = os.environ.get("PYTHONPATH")
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), held])))
        patch.chdir(root)
        try:
            yield root
        finally:
            sys.modules.pop("toy_rows", None)
            for registry, name in ((DATASETS, "toy_rows"), (MODELS, "row_mlp"),
                                   (ATTACKS, "first_layer"), (PIPELINES, "rows")):  # fmt: skip
                if registry.peek(name) is not None:
                    registry.unregister(name)


@pytest.fixture(scope="module")
def whole(root: Path) -> Path:
    """The plain run, in this process."""
    result = run_cli("run", "config.toml", "--out", "whole", "--workers", "1")
    assert result.code == 0, result.err
    # Printed by the pipeline's own table (`Pipeline.summary`), not an image run's.
    assert "first_layer" in result.out and "gaussian sigma=1" in result.out, result.out
    assert "8 trials run, 0 reused" in result.out
    return root / "whole"


def test_the_attack_recovers_every_row_undefended_and_none_under_noise(whole: Path) -> None:
    trials = pd.read_csv(whole / "trials.csv")
    assert len(trials) == 8 and set(trials["status"]) == {"ok"}
    assert trials["row_index"].nunique() == 4 and trials["row_index"].between(0, 7).all()
    none = trials[trials["defense"] == "none"]
    noisy = trials[trials["defense"] == "gaussian"]
    assert len(none) == len(noisy) == 4
    # Undefended the recovery is exact to float precision, and the attacker sees it: its
    # residual is zero to that precision too.
    assert none["max_error"].max() < 1e-4 and none["leaked"].eq(1).all()
    assert none["loss"].max() < 1e-5
    # Under sigma 1 no row comes back, and the residual says so.
    assert noisy["max_error"].min() > 0.1 and noisy["leaked"].eq(0).all()
    assert noisy["loss"].min() > 0.1
    board = pd.read_csv(whole / "leaderboard.csv").set_index("defense")
    assert board.loc["none", "leaked_rate"] == 1.0 and board.loc["gaussian", "leaked_rate"] == 0.0
    assert board["n"].tolist() == [4, 4] and board["strongest"].all()


def test_two_worker_processes_give_the_same_tables(whole: Path, root: Path) -> None:
    result = run_cli("run", "config.toml", "--out", "workers", "--workers", "2", "--quiet")
    assert result.code == 0, result.err
    _same_tables(root / "workers", whole)


def test_two_shards_merged_give_the_same_tables(whole: Path, root: Path) -> None:
    held = []
    for index in (1, 2):
        out = f"shard{index}"
        result = run_cli("run", "config.toml", "--out", out, "--shard", f"{index}/2", "--quiet")
        assert result.code == 0, result.err
        assert f"shard {index}/2;" in result.out
        held.append(set(pd.read_csv(root / out / "trials.csv")["batch_index"]))
    # Whole groups (one private batch with both defenses), the first two to shard 1.
    assert held == [{0, 1}, {2, 3}]
    merged = run_cli("merge", "shard1", "shard2", "--out", "merged")
    assert merged.code == 0, merged.err
    assert "8 trials and 0 trainings added; 0 trials and 0 trainings missing" in merged.out
    assert "gaussian sigma=1" in merged.out  # its table, printed by the rows pipeline
    _same_tables(root / "merged", whole)


def test_rescore_leaves_the_leaderboard_as_it_was(whole: Path, root: Path) -> None:
    before = pd.read_csv(whole / "leaderboard.csv")
    result = run_cli("rescore", "whole")
    assert result.code == 0, result.err
    assert "rescored whole: leaderboard.csv rewritten" in result.out
    pd.testing.assert_frame_equal(pd.read_csv(whole / "leaderboard.csv"), before)


def test_the_board_lists_the_run_s_rows(whole: Path, root: Path) -> None:
    result = run_cli("board", "whole", "--out", "board", "--quiet")
    assert result.code == 0, result.err
    assert "2 rows in 1 tables; 0 run directories apart" in result.out, result.out
    rows = pd.read_csv(root / "board" / "board.csv").set_index("defense")
    assert sorted(rows.index) == ["gaussian", "none"]
    assert rows.loc["none", "leaked"] == 4 and rows.loc["gaussian", "leaked"] == 0
    assert set(rows["n"]) == {4} and set(rows["dataset"]) == {"toy_rows"}
    assert set(rows["strongest_attack"]) == {"first_layer"} and set(rows["run_dir"]) == {"whole"}
    assert (root / "board" / "board.html").is_file()
