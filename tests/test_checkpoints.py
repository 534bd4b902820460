"""Leakage over training: ``[threat_model] checkpoints`` (`leakbench.run.checkpoints`)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from leakbench.cli import main
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.datasets import load_dataset
from leakbench.run.checkpoints import expand, steps_per_epoch
from leakbench.run.config import parse_config
from leakbench.run.plan import plan
from leakbench.run.runner import run_benchmark

CONFIG = """\
name = "ck"
dataset = "digits"
suite = "listed"
images = 1
seeds = [0]

[threat_model]
{threat}

[[attack]]
name = "idlg"
iterations = 20

[[defense]]
name = "none"

[training]
enabled = false
"""


def test_numeric_checkpoints_are_runs_with_train_steps() -> None:
    digits = load_dataset("digits")
    spec = parse_config(CONFIG.format(threat="checkpoints = [0, 0.5, 2]"))
    per_epoch = steps_per_epoch(spec.training, digits)
    assert per_epoch == len(digits.train) // 32  # the default recipe's batch of 32
    points = expand(spec, digits)
    assert [p.label for p in points] == ["epoch-0", "epoch-0.5", "epoch-2"]
    assert [p.steps for p in points] == [0, round(0.5 * per_epoch), 2 * per_epoch]
    # A checkpoint's trials are those of the config written by hand with its train_steps.
    by_hand = parse_config(CONFIG.format(threat=f"train_steps = {2 * per_epoch}"))
    assert [t.key for t in plan(points[2].spec, digits)] == [t.key for t in plan(by_hand, digits)]
    plain = parse_config(CONFIG.format(threat=""))
    assert [t.key for t in plan(points[0].spec, digits)] == [t.key for t in plan(plain, digits)]
    steps = parse_config(CONFIG.format(threat='checkpoints = [0, 7]\ncheckpoint_unit = "step"'))
    assert [p.steps for p in expand(steps, digits)] == [0, 7]


@pytest.mark.parametrize(
    ("threat", "needle"),
    [
        ("checkpoints = [0, 2, 1]", "threat_model.checkpoints must be a list of up to 16"),
        ("checkpoints = [-1]", "threat_model.checkpoints must be"),
        ("checkpoints = [0, 1]\ntrain_steps = 5", "give train_steps or checkpoints, not both"),
        ('checkpoints = [0, 1.5]\ncheckpoint_unit = "step"', "must be whole steps"),
        ('checkpoints = ["lenet"]', "'lenet' is not a saved model keras:PATH"),
        ('checkpoints = ["keras:absent.keras"]', "model keras:absent.keras: no such file"),
        ('checkpoint_unit = "round"', "threat_model.checkpoint_unit"),
    ],
)
def test_bad_checkpoints_are_refused(threat: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_config(CONFIG.format(threat=threat))


def test_a_resolved_config_names_checkpoints_only_when_set() -> None:
    plain = parse_config(CONFIG.format(threat="")).to_toml()
    assert "checkpoint" not in plain and "detect" not in plain
    assert "checkpoints = [" in parse_config(CONFIG.format(threat="checkpoints = [0, 1]")).to_toml()


def test_a_checkpoint_run_attacks_each_point_and_resumes(tmp_path: Path) -> None:
    spec = parse_config(CONFIG.format(threat="checkpoints = [0, 1]"))
    result = run_benchmark(spec, tmp_path / "out", progress=False)
    assert result.ran == 2 and result.reused == 0
    out = tmp_path / "out"
    for label in ("epoch-0", "epoch-1"):
        assert (out / "checkpoints" / label / "leaderboard.csv").is_file()
        # The model's accuracy is kept, so a resumed run does not train it again.
        assert (out / "checkpoints" / label / "model_accuracy.json").is_file()
    table = pd.read_csv(out / "checkpoints.csv")
    assert list(table["checkpoint"]) == ["epoch-0", "epoch-1"]
    assert list(table["steps"]) == [0, 42]
    assert table["model_accuracy"].between(0, 1).all()
    # The second checkpoint is a trained model: its accuracy moved from the initialisation's.
    assert table["model_accuracy"].iloc[0] != table["model_accuracy"].iloc[1]
    assert (out / "figures" / "leakage_over_training.png").is_file()
    # `leakbench figures` draws it again from the joined table.
    assert main(["figures", str(out), "--out", str(tmp_path / "redrawn")]) == 0
    assert (tmp_path / "redrawn" / "leakage_over_training.pdf").is_file()
    again = run_benchmark(spec, out, progress=False)
    assert again.ran == 0 and again.reused == 2
    # Each checkpoint's directory is an ordinary run: the one of its train_steps.
    child = (out / "checkpoints" / "epoch-1" / "config.toml").read_text(encoding="utf-8")
    assert "train_steps = 42" in child and "checkpoints" not in child


def test_saved_model_checkpoints(tmp_path: Path) -> None:
    paths = []
    for seed in (0, 1):  # two "rounds" of a federated run, saved by the server
        path = tmp_path / f"round{seed + 1}.keras"
        build_model("lenet", (8, 8, 1), 10, seed=seed).save(path)
        paths.append(f'"keras:{path}"')
    spec = parse_config(CONFIG.format(threat=f"checkpoints = [{', '.join(paths)}]"))
    result = run_benchmark(spec, tmp_path / "out", progress=False)
    table = pd.read_csv(tmp_path / "out" / "checkpoints.csv")
    assert list(table["checkpoint"]) == ["00-round1", "01-round2"]
    assert set(table["unit"]) == {"saved model"} and result.ran == 2


def test_a_bad_checkpoint_config_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(CONFIG.format(threat="checkpoints = [3, 1]"), encoding="utf-8")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "threat_model.checkpoints" in err[0]
    assert not (tmp_path / "out").exists()
