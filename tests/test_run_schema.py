"""One run description for every entry point: a config file, `leakbench.audit`, the Flower
auditor and a checkpoint run build equal `RunSpec`s for the same settings, all through
`leakbench.run.config.build_run`; and no code writes TOML text but the run's record."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

from leakbench.core.errors import ConfigError
from leakbench.datasets import load_dataset
from leakbench.run import checkpoints
from leakbench.run.audit import audit_document
from leakbench.run.config import (
    DEFAULT_CONFIG_FILE,
    RunSpec,
    build_run,
    load_config,
    parse_config,
    with_settings,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# The folders of the package (pyproject.toml's package-dir).
PACKAGE = ("bench", "attacks", "defenses", "datasets")

# The settings every entry point is given, as a config file writes them.
CONFIG = """\
name = "same"
dataset = "digits"
model = "lenet"
images = 2
batch_size = 1
seeds = [0]
lpips = "none"
{extra}
[[attack]]
name = "idlg"

[[defense]]
name = "{defense}"

[training]
enabled = false

[threat_model]
labels_known = true
{threat}"""


def _config(extra: str = "", defense: str = "fp16", threat: str = "") -> RunSpec:
    return parse_config(CONFIG.format(extra=extra, defense=defense, threat=threat))


def test_audit_arguments_build_the_config_files_run() -> None:
    doc = audit_document(
        2,
        False,
        defenses=["fp16"],
        attacks=[{"name": "idlg"}],
        batch_size=1,
        seeds=(0,),
        threat_model={"labels_known": True},
        training=None,
        name="same",
        first_batch=3,
        lpips="none",
        adaptive=False,
        suite="standard",
    )
    spec = build_run({**doc, "dataset": "digits", "model": "lenet"})

    assert spec == _config("first_batch = 3\nadaptive = false\n")
    assert spec.to_toml() == _config("first_batch = 3\nadaptive = false\n").to_toml()


def test_the_clis_settings_build_the_config_files_run(tmp_path: Path) -> None:
    # The config file's own values, changed on the command line (`leakbench run --set`).
    path = tmp_path / "other.toml"
    path.write_text(
        _config(defense="none").to_toml().replace('name = "same"', 'name = "other"'),
        encoding="utf-8",
    )
    settings = [
        "name=same",
        "first_batch = 3",
        "adaptive=false",
        'defense=[{name = "fp16"}]',
        "threat_model.labels_known=true",
    ]

    assert load_config(path, settings) == _config("first_batch = 3\nadaptive = false\n")


def test_a_setting_changes_a_nested_value_and_reads_bare_words() -> None:
    doc = {"dataset": "digits", "training": {"enabled": False}}
    out = with_settings(doc, ["training.dp.noise_multiplier=1.5", "dataset=folder:/data/x-1"])

    assert out == {
        "dataset": "folder:/data/x-1",
        "training": {"enabled": False, "dp": {"noise_multiplier": 1.5}},
    }
    assert doc == {"dataset": "digits", "training": {"enabled": False}}  # not changed


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("images", r"^--set 'images': expected KEY=VALUE, e\.g\. images=8$"),
        ("training..enabled=1", r"^--set 'training\.\.enabled=1': expected KEY=VALUE"),
        ("attack.iterations=3", r"^--set 'attack\.iterations=3': attack is a list of tables; "),
        ("images.x=1", r"^--set 'images\.x=1': images is a value, not a table$"),
        ("name=a b", r"^--set 'name=a b': the value is neither TOML nor a bare word"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(setting: str, message: str) -> None:
    doc = {"images": 2, "attack": [{"name": "idlg"}]}
    with pytest.raises(ConfigError, match=message):
        with_settings(doc, [setting])


def test_a_setting_is_checked_as_the_file_is() -> None:
    with pytest.raises(ConfigError, match=r"^images must be an integer in \[1, 100000\], got 0$"):
        load_config(None, ["images=0"])


def test_flower_auditor_builds_the_config_files_run(tmp_path: Path) -> None:
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.serverapp.strategy import FedAvg

    from leakbench.integrations.flower import LeakageAuditor

    auditor = LeakageAuditor(
        FedAvg(),
        out=tmp_path / "audit",
        private_data=lambda client, rnd: (None, None),
        deployment="same",
        labels_known=True,
        figures=False,
    )
    # Before any round the record holds one batch and the clients' defense none.
    expected = _config("parallel_trials = 1\n", defense="none")
    spec = build_run(auditor._record(), runnable=False)

    assert spec == dataclasses.replace(expected, images=1)


def test_a_checkpoint_run_is_the_config_with_its_model_state() -> None:
    family = _config(threat='checkpoints = [0, 4]\ncheckpoint_unit = "step"\n')
    points = checkpoints.expand(family, load_dataset("digits"))

    assert [p.spec for p in points] == [_config(), _config(threat="train_steps = 4\n")]


def test_the_default_run_is_the_shipped_file() -> None:
    text = DEFAULT_CONFIG_FILE.read_text(encoding="utf-8")

    assert load_config(None) == parse_config(text) == build_run(tomllib.loads(text))
    spec = load_config(None)
    assert build_run(spec.to_mapping()) == spec


def test_a_mapping_is_checked_as_a_file_is() -> None:
    with pytest.raises(ConfigError, match=r"^images must be an integer in \[1, 100000\], got 0$"):
        build_run({"images": 0, "attack": [{"name": "idlg"}]})
    with pytest.raises(ConfigError, match=r"^unknown key 'imagez'"):
        build_run({"imagez": 1, "attack": [{"name": "idlg"}]})
    # A tuple is read as the list TOML has: a sweep.
    spec = build_run(
        {"attack": [{"name": "idlg"}], "defense": [{"name": "prune", "ratio": (0.2, 0.5)}]}
    )
    assert len(spec.defense_grid()) == 2


def _dumps_calls(path: Path) -> list[str]:
    """Where ``path`` calls ``dumps`` of tomli_w (as ``tomli_w.dumps`` or imported by name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {"tomli_w.dumps"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tomli_w":
            names |= {alias.asname or alias.name for alias in node.names if alias.name == "dumps"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func)
            if text in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_run_record_writes_toml_text() -> None:
    calls = [call for folder in PACKAGE for p in sorted((ROOT / folder).rglob("*.py"))
             for call in _dumps_calls(p)]  # fmt: skip
    record = ROOT / "bench" / "run" / "document.py"
    tree = ast.parse(record.read_text(encoding="utf-8"))
    (writer,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "record_text"
    ]

    assert len(calls) == 1
    assert calls[0] == f"bench/run/document.py:{writer.body[-1].lineno}"
