"""Plugins from the command line and paths relative to the config file.

The README's one-file defense (``Sign``), copied from README.md as it is, saved as
``my_sign.py`` and run by ``leakbench run`` through a config's ``plugins`` and through
``--plugin``; the run records the plugin, so that a resumed run, ``rescore`` and a fresh process
reading its ``config.toml`` find it. A config's relative ``npz:`` path is its folder's, whatever
the working directory, and the run records it relative to the working directory (the meaning a
relative path in a run's ``config.toml`` has always had); the ``[[attack]]`` table is optional
under the standard suite.

The runs call `main` in this process (the attack's program compiles once per process); each
test writes its plugin to a folder of its own, and the fixture unregisters what it registered.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_capture import run_cli

from leakbench.attacks.suite import FAMILIES
from leakbench.core import plugins
from leakbench.core.errors import ConfigError
from leakbench.core.plugins import PluginError, load_plugin
from leakbench.defenses import DEFENSES, make_defense
from leakbench.run.config import (
    load_config,
    load_record,
    parse_config,
    resolve_paths,
    without_adaptive,
)
from leakbench.run.submission import EntryRefused, check_paths, load_submitted

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)\n```", re.S | re.M)

# A run of a few seconds: two digits, idlg of 5 iterations, no training.
RUN = """\
{plugins}name = "{name}"
dataset = "{dataset}"
model = "lenet"
suite = "listed"
images = 2
seeds = [0]
lpips = "none"

[[attack]]
name = "idlg"
iterations = 5

[[defense]]
name = "none"

[[defense]]
name = "{defense}"

[training]
enabled = false
"""

# A plugin defense that declares no adaptive attack.
BARE = '''\
import dataclasses

from leakbench.defenses import DEFENSES, Defense


@DEFENSES.register("bare_halve")
@dataclasses.dataclass(frozen=True)
class BareHalve(Defense):
    """Shares half of each tensor.

    Reference:
        None; a fixture.
    """

    name = "bare_halve"

    def __call__(self, grads, *, seed):
        del seed
        return [g * 0.5 for g in grads]
'''


def sign_block(page: Path) -> str:
    """The Python block of ``page`` that defines the ``Sign`` defense, as it is written."""
    blocks = [b for b in FENCE.findall(page.read_text(encoding="utf-8")) if "class Sign(" in b]
    assert len(blocks) == 1, f"{page.name}: expected one block with class Sign"
    return blocks[0] + "\n"


@pytest.fixture(autouse=True)
def unregister() -> Iterator[None]:
    """Whatever a test's plugins register is unregistered after it."""
    before = set(DEFENSES.names())
    yield
    for name in set(DEFENSES.names()) - before:
        DEFENSES.unregister(name)


def _config(folder: Path, *, plugins: str = "", defense: str = "sign", **values: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = RUN.format(
        plugins=plugins,
        name=values.get("name", "plugin-cli"),
        dataset=values.get("dataset", "digits"),
        defense=defense,
    )
    path = folder / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _sign(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my_sign.py"
    path.write_text(sign_block(ROOT / "README.md"), encoding="utf-8")
    return path


def _ran_defenses(out: Path) -> set[str]:
    return set(pd.read_csv(out / "trials.csv")["defense"])


# --- the README's defense ---------------------------------------------------------------------


def test_the_readme_and_contributing_carry_the_same_sign_defense() -> None:
    readme = sign_block(ROOT / "README.md")

    assert readme == sign_block(ROOT / "docs" / "CONTRIBUTING.md")
    assert "adaptive = (AdaptiveSetting(" in readme


def test_the_readme_defense_runs_from_a_configs_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = _sign(tmp_path / "project")
    config = _config(tmp_path / "project", plugins='plugins = ["my_sign.py"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the plugin is the config's folder's, not the working one's

    result = run_cli("run", str(config), "--out", "out", "--quiet")

    assert result.code == 0, result.err
    assert "adaptive" not in result.err  # Sign declares its adaptive attack
    out = elsewhere / "out"
    assert _ran_defenses(out) == {"none", "sign"}
    record = (out / "config.toml").read_text(encoding="utf-8")
    # Recorded as the working directory reaches it, as every relative path of a record is.
    assert record.startswith('plugins = [\n    "../project/my_sign.py",\n]\nname = ')
    assert (elsewhere / "../project/my_sign.py").resolve() == plugin.resolve()
    # rescore reads the record, plugins and all
    assert run_cli("rescore", str(out)).code == 0
    # A process that has not imported the plugin reads the record alone and finds the
    # defense, as a worker (`leakbench.run.dispatch.WorkerState`) and merge parse it.
    code = (
        "import sys; from pathlib import Path; from leakbench.run.config import parse_config; "
        "spec = parse_config(Path(sys.argv[1]).read_text(), 'config.toml'); "
        "print(*[d.name for d in spec.defense_grid()])"
    )
    env = dict(os.environ, PYTHONSAFEPATH="1", TF_CPP_MIN_LOG_LEVEL="3")
    fresh = subprocess.run(
        [sys.executable, "-c", code, str(out / "config.toml")],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert fresh.stdout.split() == ["none", "sign"]


def test_the_readme_defense_runs_with_the_plugin_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = _sign(tmp_path / "work")
    config = _config(tmp_path / "configs")
    monkeypatch.chdir(tmp_path / "work")  # --plugin is the working directory's

    first = run_cli("run", str(config), "--out", "out", "--quiet", "--plugin", "my_sign.py")

    assert first.code == 0, first.err
    assert _ran_defenses(Path("out")) == {"none", "sign"}
    assert load_record(Path("out") / "config.toml").plugins == ("my_sign.py",)
    # The same command resumes: the plugin, loaded again, is a no-op, and nothing reruns.
    again = run_cli("run", str(config), "--out", "out", "--quiet", "--plugin", "my_sign.py")
    assert again.code == 0, again.err
    assert again.out.strip().splitlines()[-1].startswith("0 trials run")
    # The config naming the same file (relative to its own folder) records the same run.
    named = config.read_text(encoding="utf-8")
    config.write_text('plugins = ["../work/my_sign.py"]\n' + named, encoding="utf-8")
    record = (Path("out") / "config.toml").read_text(encoding="utf-8")
    assert load_config(config).to_toml() == record
    assert plugin.is_file()


def test_a_config_without_plugins_records_none() -> None:
    text = RUN.format(plugins="", name="plain", dataset="digits", defense="fp16")

    assert "plugins" not in parse_config(text).to_toml()
    assert parse_config(text).plugins == ()


# --- errors -----------------------------------------------------------------------------------


def test_an_unknown_plugin_file_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path / "cfg", defense="none")
    monkeypatch.chdir(tmp_path)

    given = run_cli("run", str(config), "--out", "out", "--plugin", "absent.py")

    assert given.code == 2
    assert given.err.splitlines() == [
        f"leakbench: error: plugins[0] absent.py: {tmp_path / 'absent.py'} does not exist (a "
        "relative path given on the command line is resolved against the working directory)"
    ]
    listed = _config(tmp_path / "cfg", plugins='plugins = ["absent.py"]\n', defense="none")
    named = run_cli("run", str(listed), "--out", "out")
    assert named.code == 2
    assert named.err.splitlines() == [
        f"leakbench: error: plugins[0] absent.py: {tmp_path / 'cfg' / 'absent.py'} does not "
        "exist (a relative path in a config file is resolved against the config's folder)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("plugin", "needle"),
    [
        ("no_such_plugin_module", "plugin no_such_plugin_module: no module named"),
        ("not a module", "plugin 'not a module': neither a .py file nor a module name"),
        ("{tmp}/broken.py", "plugin {tmp}/broken.py ({tmp}/broken.py) failed to load: "),
    ],
)
def test_a_plugin_that_cannot_load_is_one_line_and_exit_2(
    tmp_path: Path, plugin: str, needle: str
) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('no\\nway')\n", encoding="utf-8")
    config = _config(tmp_path, defense="none")

    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--plugin",
                     plugin.format(tmp=tmp_path))  # fmt: skip

    assert result.code == 2
    (line,) = result.err.splitlines()
    assert line.startswith(f"leakbench: error: {needle.format(tmp=tmp_path)}")


def test_loading_a_file_twice_imports_it_once(tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    plugin = tmp_path / "counted.py"
    plugin.write_text(
        f"from pathlib import Path\nPath({str(count)!r}).open('a').write('x')\n", encoding="utf-8"
    )

    assert load_plugin(str(plugin)) == load_plugin("counted.py", tmp_path) == str(plugin)
    assert count.read_text() == "x"
    (tmp_path / "bad.py").write_text("1 / 0\n", encoding="utf-8")
    with pytest.raises(PluginError, match="failed to load: ZeroDivisionError: division by zero"):
        load_plugin(str(tmp_path / "bad.py"))
    assert not [m for m in sys.modules if m.startswith("_leakbench_plugin_bad_")]
    assert plugins._files  # the loaded files are remembered by their resolved paths


def test_the_board_imports_no_plugin_file_a_submission_names(tmp_path: Path) -> None:
    check_paths({"plugins": ["some_package.defenses"]}, [tmp_path])  # installed code: read
    with pytest.raises(EntryRefused, match="names the plugin file evil.py; the board imports"):
        check_paths({"plugins": ["some_package.defenses", "evil.py"]}, [tmp_path])
    # Nor does `board --verify` rerun one: refused before it is imported.
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    record = tmp_path / "config.toml"
    record.write_text(f'plugins = ["{evil}"]\n' + RUN.format(plugins="", name="x",
                      dataset="digits", defense="fp16"), encoding="utf-8")  # fmt: skip
    with pytest.raises(EntryRefused, match="names the plugin file"):
        load_submitted(record)
    assert not marker.exists()


# --- a defense without an adaptive attack -----------------------------------------------------


def test_a_plugin_defense_without_an_adaptive_attack_gets_one_warning(tmp_path: Path) -> None:
    (tmp_path / "bare.py").write_text(BARE, encoding="utf-8")
    config = _config(tmp_path, plugins='plugins = ["bare.py"]\n', defense="bare_halve")

    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")

    assert result.code == 0, result.err
    warnings = [line for line in result.err.splitlines() if "adaptive" in line]
    assert warnings == [
        "leakbench: warning: defense bare_halve declares no adaptive attack (its class's "
        "`adaptive` is empty): the standard suite meets it with untuned attacks only, so a "
        "'holds' may be a weak attack's; declare the attack settings that answer it "
        "(docs/CONTRIBUTING.md, 'A defense'), or list the learned attack, which learns "
        'through any defense ([[attack]] name = "learned")'
    ]
    assert _ran_defenses(tmp_path / "out") == {"none", "bare_halve"}  # the run went on
    # A chain counts its steps: the plugin step is named once, the built-in step not.
    chain = make_defense(
        "chain", steps=[{"name": "bare_halve"}, {"name": "gaussian", "sigma": 0.1}]
    )
    assert len(without_adaptive([chain, make_defense("bare_halve")])) == 1


def test_no_built_in_defense_warns() -> None:
    grid = []
    for name in DEFENSES.names():
        cls = DEFENSES.get(name)
        if cls.__module__.startswith("leakbench.") and cls.samples:
            grid.append(make_defense(name, **dict(cls.samples[0].params)))

    assert {d.name for d in grid} >= {"none", "gaussian", "fp16", "int8", "relative_noise"}
    assert without_adaptive(grid) == []


# --- paths relative to the config's folder ----------------------------------------------------


def _npz(path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(40, 8, 8), dtype=np.uint8)
    np.savez(path, x=images, y=np.arange(40) % 4)


def test_a_relative_npz_path_is_the_config_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path / "cfg", defense="fp16", dataset="npz:data.npz")
    _npz(tmp_path / "cfg" / "data.npz")
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")

    spec = load_config(config)
    result = run_cli("run", str(config), "--out", "out", "--quiet")

    # Recorded relative to the working directory, as a run's config.toml has always named it.
    assert spec.dataset == "npz:../cfg/data.npz"
    assert result.code == 0, result.err
    record = tmp_path / "run" / "out" / "config.toml"
    assert 'dataset = "npz:../cfg/data.npz"' in record.read_text()
    assert run_cli("rescore", "out").code == 0
    # Run from the config's own folder, a path is recorded as written (its keys as they were).
    monkeypatch.chdir(tmp_path / "cfg")
    assert load_config("run.toml").dataset == "npz:data.npz"
    assert load_config(config).to_toml() == parse_config(config.read_text()).to_toml()


def test_a_missing_relative_path_names_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path / "cfg", defense="fp16", dataset="npz:data.npz")
    monkeypatch.chdir(tmp_path)

    result = run_cli("run", str(config), "--out", "out")

    assert result.code == 2
    assert result.err.splitlines() == [
        f"leakbench: error: dataset npz:data.npz: {tmp_path / 'cfg' / 'data.npz'} does not "
        "exist (a relative path in a config file is resolved against the config's folder)"
    ]
    # A --set value is the command line's: the working directory's (and the file's path it
    # replaces is not needed).
    with pytest.raises(ConfigError, match="working directory") as info:
        load_config(config, ["dataset=idx:mnist"])
    assert str(tmp_path / "mnist") in str(info.value)


def test_every_kind_of_path_resolves_and_absolute_ones_stay_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    for name in ("m.keras", "c1.keras", "p.py", "data"):
        (folder / name).touch()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    doc = {
        "dataset": "folder:data",
        "model": "keras:m.keras",
        "plugins": ["p.py", "my_package.defenses"],
        "threat_model": {"checkpoints": ["keras:c1.keras", "keras:/abs/c2.keras"]},
    }

    resolved = resolve_paths(doc, folder)

    assert resolved == {
        "dataset": "folder:../cfg/data",
        "model": "keras:../cfg/m.keras",
        "plugins": ["../cfg/p.py", "my_package.defenses"],
        "threat_model": {"checkpoints": ["keras:../cfg/c1.keras", "keras:/abs/c2.keras"]},
    }
    fixed = {"dataset": "npz:/data/x.npz", "model": "keras:~/m.keras", "plugins": ["a.b"]}
    assert resolve_paths(fixed, folder) == fixed
    named = {"dataset": "digits", "model": "lenet"}
    assert resolve_paths(named, folder) == named


def test_an_absolute_path_config_resolves_to_the_text_it_did(tmp_path: Path) -> None:
    _npz(tmp_path / "data.npz")
    text = RUN.format(plugins="", name="abs", dataset=f"npz:{tmp_path / 'data.npz'}",
                      defense="fp16")  # fmt: skip
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.toml").write_text(text, encoding="utf-8")

    assert load_config(tmp_path / "sub" / "run.toml").to_toml() == parse_config(text).to_toml()


def test_a_record_is_read_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run directory's config.toml made before paths were resolved names them relative to the
    # working directory it ran in: read as written, its keys stay those of its trials.
    _npz(tmp_path / "data.npz")
    (tmp_path / "old").mkdir()
    record = tmp_path / "old" / "config.toml"
    record.write_text(RUN.format(plugins="", name="old", dataset="npz:data.npz",
                                 defense="fp16"), encoding="utf-8")  # fmt: skip
    monkeypatch.chdir(tmp_path)

    assert load_record(record).dataset == "npz:data.npz"


# --- [[attack]] under the standard suite ------------------------------------------------------


def test_the_standard_suite_needs_no_attack_table() -> None:
    spec = parse_config('name = "families"\n[training]\nenabled = false\n')

    assert spec.attacks == ()
    assert {a.name for a in spec.all_attacks()} == set(FAMILIES)
    assert "[[attack]]" not in spec.to_toml()
    assert parse_config(spec.to_toml()) == spec


@pytest.mark.parametrize(
    ("top", "why"),
    [
        ('suite = "listed"\n', 'suite = "listed" runs only the attacks a config lists'),
        ("adaptive = false\n", "adaptive = false runs only the attacks a config lists"),
        (
            '[threat_model]\nserver = "malicious"\n',
            "the standard suite's families attack an honest server's gradient",
        ),
    ],
)
def test_a_run_without_attacks_is_one_line_and_exit_2(tmp_path: Path, top: str, why: str) -> None:
    config = tmp_path / "none.toml"
    config.write_text('name = "none"\n' + top, encoding="utf-8")

    result = run_cli("run", str(config), "--out", str(tmp_path / "out"))

    assert result.code == 2
    (line,) = result.err.splitlines()
    assert line.startswith(f"leakbench: error: {why}: add at least one [[attack]] table (names: ")
