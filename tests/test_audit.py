"""The notebook API, `leakbench.audit`: the CLI's run behind a function of a Keras model and
numpy arrays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

import leakbench
from leakbench.cli import main
from leakbench.core.errors import ConfigError, DataError, LeakbenchError
from leakbench.datasets import Dataset

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = [{"name": "idlg", "iterations": 40}]
DEFENSES = ["none", {"name": "gaussian", "sigma": 0.01}]
NUMBERS = ["mse", "psnr", "label_acc", "iterations", "loss"]
ORDER = ["defense", "defense_params", "seed", "batch_index", "position"]


def _model(digits: Dataset) -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input(digits.input_shape),
            keras.layers.Conv2D(4, 3, padding="same", activation="sigmoid"),
            keras.layers.Flatten(),
            keras.layers.Dense(digits.num_classes, activation="softmax"),
        ]
    )


def test_audit_gives_the_trials_of_the_cli_and_resumes(digits: Dataset, tmp_path: Path) -> None:
    model = _model(digits)
    images, labels = digits.test.x[:3], digits.test.y[:3]
    result = leakbench.audit(
        model, images, labels, defenses=DEFENSES, attacks=ATTACKS, out=tmp_path / "api",
        progress=False, suite="listed",
    )  # fmt: skip
    assert result.ran == 6 and result.reused == 0
    assert len(result.trials) == 6 and len(result.leaderboard) == 2
    assert result.figure is not None and result.out_dir == tmp_path / "api"
    # The config it wrote, run by the CLI, gives the same trials.
    config = tmp_path / "api" / "config.toml"
    assert config.read_text(encoding="utf-8") == result.config
    assert main(["run", str(config), "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    cli = pd.read_csv(tmp_path / "cli" / "trials.csv")
    api = result.trials
    pd.testing.assert_frame_equal(
        api.sort_values(ORDER)[NUMBERS].reset_index(drop=True),
        cli.sort_values(ORDER)[NUMBERS].reset_index(drop=True),
        check_dtype=False,
    )
    # The same call again resumes: every trial is reused, the numbers are the same.
    again = leakbench.audit(
        model, images, labels, defenses=DEFENSES, attacks=ATTACKS, out=tmp_path / "api",
        progress=False, suite="listed",
    )  # fmt: skip
    assert again.ran == 0 and again.reused == 6
    pd.testing.assert_frame_equal(again.trials, result.trials)


def test_first_batch_numbers_the_batches_and_leaves_other_runs_alone(digits: Dataset) -> None:
    from configs import run_config

    from leakbench.run.config import parse_config
    from leakbench.run.plan import plan

    text = run_config("numbered", images=2, defenses=({"name": "gaussian", "sigma": 0.1},))
    plain = plan(parse_config(text), digits)
    # Unset and 0 are the same run: the same keys, and a resolved config without the key.
    assert [t.key for t in plan(parse_config("first_batch = 0\n" + text), digits)] == [
        t.key for t in plain
    ]
    assert "first_batch" not in parse_config(text).to_toml()
    later = plan(parse_config("first_batch = 5\n" + text), digits)
    assert [t.batch_index for t in plain] == [0, 1] and [t.batch_index for t in later] == [5, 6]
    assert [t.indices for t in later] == [t.indices for t in plain]
    assert not {t.key for t in later} & {t.key for t in plain}


def test_audit_passes_first_batch_to_the_run(digits: Dataset) -> None:
    result = leakbench.audit(
        _model(digits), digits.test.x[:1], digits.test.y[:1], attacks=[{"name": "idlg",
        "iterations": 3}], first_batch=4, lpips="none", adaptive=False, progress=False,
    )  # fmt: skip
    assert result.trials["batch_index"].tolist() == [4]
    assert "first_batch = 4" in result.config and "adaptive = false" in result.config


def test_audit_without_out_leaves_nothing(digits: Dataset, tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    result = leakbench.audit(
        _model(digits),
        digits.test.x[:1],
        digits.test.y[:1],
        attacks=ATTACKS,
        progress=False,
        suite="listed",
    )
    assert result.out_dir is None and len(result.trials) == 1
    assert set(os.listdir(tmp_path)) == before


def test_audit_refuses_other_images_in_the_same_directory(digits: Dataset, tmp_path: Path) -> None:
    model = _model(digits)
    out = tmp_path / "api"
    leakbench.audit(model, digits.test.x[:1], digits.test.y[:1], attacks=ATTACKS, out=out,
                    progress=False, suite="listed")  # fmt: skip
    with pytest.raises(ConfigError, match="holds an audit of other images"):
        leakbench.audit(model, digits.test.x[1:2], digits.test.y[1:2], attacks=ATTACKS,
                        out=out, progress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"labels": np.array([0, 1])}, ConfigError, "labels: 2 labels for 1 images"),
        ({"labels": np.array([12])}, ConfigError, "the model has 10 outputs"),
        ({"images": np.zeros((1, 8))}, DataError, "images"),
        ({"attacks": ["frobnicate"]}, LeakbenchError, "unknown attack .frobnicate."),
        ({"attacks": [3]}, ConfigError, "attacks: each entry is a name or a table"),
        ({"model": "weights.txt"}, LeakbenchError, "unknown model 'weights.txt'"),
        ({"model": 3}, ConfigError, "model: give a Keras model"),
        (
            {"threat_model": {"server": "malicious"}, "attacks": ["imprint"]},
            ConfigError,
            "public: a malicious server",
        ),  # fmt: skip
        ({"training": {"epochs": 1}}, ConfigError, "training: needs public"),
        ({"first_batch": -1}, ConfigError, "first_batch must be"),
    ],
)
def test_audit_refuses_bad_arguments_before_writing(
    kwargs: dict, error: type[Exception], needle: str, digits: Dataset, tmp_path: Path
) -> None:
    args = {
        "model": _model(digits),
        "images": digits.test.x[:1],
        "labels": digits.test.y[:1],
        "attacks": ATTACKS,
        "out": tmp_path / "out",
        "progress": False,
        "suite": "listed",
        **kwargs,
    }
    with pytest.raises(error, match=needle):
        leakbench.audit(**args)
    assert not (tmp_path / "out").exists()


def test_the_example_runs(tmp_path: Path) -> None:
    """examples/audit_your_model.py as a user runs it: trains, saves, audits, draws."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "audit_your_model.py"), "--out", str(tmp_path),
         "--images", "2", "--epochs", "2"],  # fmt: skip
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test accuracy" in proc.stdout and "verdict" in proc.stdout
    assert (tmp_path / "reconstructions.png").is_file()
    assert (tmp_path / "run" / "leaderboard.csv").is_file()


def test_a_text_model_name_is_refused_in_one_line(tmp_path: Path) -> None:
    # audit() attacks images: a text model of the one model registry is named and refused.
    with pytest.raises(leakbench.UnknownNameError, match="'gru' is a text model") as info:
        leakbench.audit("gru", np.zeros((2, 8, 8), np.uint8), np.zeros(2, int), out=tmp_path / "a")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "a").exists()
