"""Plugins: the Python API for a researcher's own defense, and installed entry-point packages.

The entry-point tests write into a temporary folder what pip would install (a package and its
``*.dist-info`` with ``entry_points.txt``) and put the folder on ``PYTHONPATH`` of a fresh CLI
process, where `importlib.metadata` finds it: no network, no change to this environment.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.core import plugins
from leakbench.core.errors import ConfigError
from leakbench.defenses import (
    DEFENSES,
    Defense,
    Sample,
    defense_from_function,
    function_defense,
    make_defense,
    tensor_seed,
)
from leakbench.run.config import parse_config
from leakbench.run.runner import run_benchmark

IMAGES = 2
RUN = f"""\
name = "plugin"
dataset = "digits"
suite = "listed"
images = {IMAGES}
seeds = [0]

[[attack]]
name = "idlg"
iterations = 5

[[defense]]
name = "{{defense}}"
{{params}}
[training]
enabled = false
"""

DEMO = '''\
"""A demo plugin: a defense that halves every gradient tensor."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from leakbench.defenses import Defense


@dataclasses.dataclass(frozen=True)
class Halve(Defense):
    """Multiplies every gradient tensor by 0.5 (a test plugin).

    Reference:
        None; a fixture of leakbench's plugin tests.
    """

    name: ClassVar[str] = "halve"

    def __call__(self, grads, *, seed):
        del seed
        return [g * 0.5 for g in grads]
'''
BROKEN = 'raise ImportError("lb_plugin_broken needs the missing package frobnitz")\n'
BROKEN_ENTRY = "broken = lb_plugin_broken:Thing"


def _install(site: Path, package: str, code: str, entry_points: str) -> None:
    """Writes an installed distribution as pip lays it out: the package and its dist-info."""
    (site / package).mkdir()
    (site / package / "__init__.py").write_text(code, encoding="utf-8")
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder with a working and a broken plugin, both declaring defenses."""
    root = tmp_path_factory.mktemp("site")
    _install(root, "lb_plugin_demo", DEMO, "[leakbench.defenses]\nhalve = lb_plugin_demo:Halve\n")
    _install(root, "lb_plugin_broken", BROKEN, f"[leakbench.defenses]\n{BROKEN_ENTRY}\n")
    return root


def _cli() -> list[str]:
    """The console script if installed (as a user runs it), else the module."""
    found = shutil.which("leakbench") or str(Path(sys.executable).parent / "leakbench")
    return [found] if os.path.exists(found) else [sys.executable, "-m", "leakbench.cli"]


def _run_cli(site: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(site))
    return subprocess.run(
        [*_cli(), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# --- installed entry points, through the CLI ------------------------------------------------------


def test_list_shows_the_plugin_and_warns_once_about_the_broken_one(
    site: Path, tmp_path: Path
) -> None:
    proc = _run_cli(site, tmp_path, "list")

    assert proc.returncode == 0, proc.stderr
    defenses = proc.stdout.split("defenses:\n", 1)[1]
    assert "  halve " in defenses
    assert "Multiplies every gradient tensor by 0.5" in defenses
    assert "  gaussian " in defenses  # a broken plugin blocks only its own name
    assert "broken" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("leakbench: warning: plugin entry point")
    assert BROKEN_ENTRY in lines[0] and "lb_plugin_broken 0.1" in lines[0]
    assert "ImportError: lb_plugin_broken needs the missing package frobnitz" in lines[0]


def test_run_uses_the_plugin_defense(site: Path, tmp_path: Path) -> None:
    config = tmp_path / "plugin.toml"
    config.write_text(RUN.format(defense="halve", params=""), encoding="utf-8")
    out = tmp_path / "out"

    proc = _run_cli(site, tmp_path, "run", str(config), "--out", str(out), "--quiet")

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == IMAGES
    assert set(trials["defense"]) == {"halve"}
    assert set(trials["status"]) == {"ok"}


PRIOR_PLUGIN = '''\
"""A demo plugin prior: the mean squared pixel value (pulls dummy images towards black)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from leakbench.attacks.priors import Prior


@dataclasses.dataclass(frozen=True)
class PixelEnergy(Prior):
    """Mean squared pixel value of each problem's images."""

    name = "pixel_energy"

    def penalty(self, images, context):
        del context
        return tf.reduce_mean(tf.square(images), axis=[1, 2, 3, 4])
'''
ATTACK_PLUGIN = '''\
"""A demo plugin attack: answers every batch with a grey image and label 0."""

from __future__ import annotations

import dataclasses

import numpy as np

from leakbench.attacks import Attack
from leakbench.attacks.base import RunOutput


@dataclasses.dataclass(frozen=True)
class Grey(Attack):
    """Reconstructs every image as a uniform grey of ``level``."""

    name = "grey"
    level: float = 0.5

    def run(self, target, seed):
        del seed
        shape = (target.batch_size, *target.input_shape)
        return RunOutput(
            images=np.full(shape, self.level, np.float32),
            labels=np.zeros(target.batch_size, np.int64),
            loss=0.0,
            loss_history=np.zeros(1, np.float32),
            evaluations=0,
        )
'''
COMPOSED_RUN = """\
name = "composed"
dataset = "digits"
suite = "listed"
images = 2

[[attack]]
name = "idlg"
iterations = 100
priors = [{ name = "pixel_energy", weight = %s }]

[[attack]]
name = "grey"
level = 0.25

[training]
enabled = false
"""


def test_run_uses_a_plugin_prior_and_a_plugin_attack(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "lb_plugin_prior", PRIOR_PLUGIN,
             "[leakbench.priors]\npixel_energy = lb_plugin_prior:PixelEnergy\n")  # fmt: skip
    _install(site, "lb_plugin_attack", ATTACK_PLUGIN,
             "[leakbench.attacks]\ngrey = lb_plugin_attack:Grey\n")  # fmt: skip
    frames = {}
    for weight in ("0.0", "1000.0"):
        config = tmp_path / f"composed-{weight}.toml"
        config.write_text(COMPOSED_RUN % weight, encoding="utf-8")
        out = tmp_path / f"out-{weight}"
        proc = _run_cli(site, tmp_path, "run", str(config), "--out", str(out), "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        frames[weight] = pd.read_csv(out / "trials.csv")
    trials = frames["1000.0"]
    grey = trials[trials["attack"] == "grey"]
    assert len(grey) == IMAGES and set(grey["status"]) == {"ok"}
    assert json.loads(grey["attack_params"].iloc[0])["level"] == 0.25
    idlg = trials[trials["attack"] == "idlg"]
    assert json.loads(idlg["attack_params"].iloc[0])["priors"] == [
        {"name": "pixel_energy", "weight": 1000.0}
    ]
    # The plugin prior is in the loss: a huge weight pulls the images far from the private
    # ones, while without it iDLG recovers them. (100 iterations, not fewer: at 40, 2 of 16
    # images over seeds 0-7 were still at 13-17 dB, so the bound hung on each search's speed;
    # at 100 all 64 images of seeds 0-31 reached 100 dB, and the prior's 16 stay at 5-8 dB.)
    plain = frames["0.0"]
    plain = plain[plain["attack"] == "idlg"]
    assert plain["psnr"].min() > 30
    assert idlg["psnr"].max() < plain["psnr"].min() - 10


def test_using_a_broken_plugin_exits_2_with_one_line(site: Path, tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(RUN.format(defense="broken", params=""), encoding="utf-8")
    out = tmp_path / "out"

    proc = _run_cli(site, tmp_path, "run", str(config), "--out", str(out), "--quiet")

    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("leakbench: error: plugin entry point")
    assert BROKEN_ENTRY in lines[0] and "failed to load: ImportError" in lines[0]
    assert not out.exists()


# --- the Python API -------------------------------------------------------------------------------


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    """Names to unregister after the test, so that other tests see the built-ins only."""
    names: list[str] = []
    yield names
    for name in names:
        if DEFENSES.peek(name) is not None:
            DEFENSES.unregister(name)


def test_function_defense_runs_a_spec_from_python(cleanup: list[str], tmp_path: Path) -> None:
    name = "test_plugins_scale"
    cleanup.append(name)

    @function_defense(name)
    def scale(grads: list[tf.Tensor], factor: float = 0.5) -> list[tf.Tensor]:
        """Multiplies every gradient tensor by ``factor``."""
        return [g * tf.cast(factor, g.dtype) for g in grads]

    assert scale([tf.constant(2.0)])[0].numpy() == 1.0  # the decorator returns the function
    (halved,) = make_defense(name, factor=0.25)(
        [tf.constant([4.0, -8.0])], seed=tf.constant([0, 0])
    )
    np.testing.assert_array_equal(halved.numpy(), [1.0, -2.0])

    spec = parse_config(RUN.format(defense=name, params="factor = [0.25, 0.5]"))
    result = run_benchmark(spec, tmp_path / "out", progress=False)

    trials = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert len(trials) == 2 * IMAGES
    assert set(trials["defense"]) == {name}
    factors = sorted(json.loads(p)["factor"] for p in trials["defense_params"])
    assert factors == [0.25, 0.25, 0.5, 0.5]
    assert result.ran == 2 * IMAGES


def test_function_defense_passes_the_defense_contract(
    cleanup: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs every registry-wide test of tests/test_defenses.py on a seeded function defense."""
    import test_defenses as contract

    name = "test_plugins_jitter"
    cleanup.append(name)

    def jitter(grads: list[tf.Tensor], seed: tf.Tensor, width: float = 0.1) -> list[tf.Tensor]:
        """Adds uniform noise in [0, width) to every gradient entry."""
        return [
            g
            + tf.random.stateless_uniform(tf.shape(g), tensor_seed(seed, i), dtype=g.dtype)
            * tf.cast(width, g.dtype)
            for i, g in enumerate(grads)
        ]

    cls = defense_from_function(name, jitter, reference="None; a test fixture.")
    assert issubclass(cls, Defense) and DEFENSES.get(name) is cls and cls.function is jitter
    monkeypatch.setattr(cls, "samples", (Sample({"width": 0.5}, seeded=True),), raising=False)

    contract.test_every_defense_declares_samples(name)
    contract.test_epsilon_only_for_dp_defenses(name, 0)
    contract.test_class_metadata(name)
    contract.test_frozen_hashable_and_params_round_trip(name, 0)
    for dtype in (tf.float32, tf.float64, tf.float16):
        contract.test_structure_shapes_and_dtypes_preserved(name, 0, dtype)
    contract.test_empty_gradient_list(name, 0)
    for seed_dtype in (tf.int32, tf.int64):
        contract.test_same_seed_same_output(name, 0, seed_dtype)
    contract.test_seed_dependence(name, 0)
    contract.test_traced_once_for_different_seeds(name, 0)
    contract.test_graph_mode_matches_eager(name, 0)
    contract.test_unknown_shapes_in_graph(name, 0)


def test_function_defense_checks_its_signature_and_parameter_values(cleanup: list[str]) -> None:
    name = "test_plugins_checked"
    cleanup.append(name)

    def ok(grads: list[tf.Tensor], *, factor: float = 0.5, mode: str = "a") -> list[tf.Tensor]:
        return grads

    defense_from_function(name, ok)
    with pytest.raises(ConfigError, match=rf"defense {name}: factor must be a number, got 'x'"):
        make_defense(name, factor="x")
    with pytest.raises(ConfigError, match=rf"defense {name}: mode must be a string, got 1"):
        make_defense(name, mode=1)
    with pytest.raises(ConfigError, match="unknown parameter 'bogus'"):
        make_defense(name, bogus=1)
    with pytest.raises(ValueError, match="already registered"):
        defense_from_function(name, ok)
    with pytest.raises(TypeError, match=r"'rest' must be passable by keyword"):
        defense_from_function("test_plugins_varargs", lambda grads, *rest: grads)
    with pytest.raises(TypeError, match="defaults must be None, a bool"):
        defense_from_function("test_plugins_list", lambda grads, sizes=[1]: grads)  # noqa: B006
    with pytest.raises(ValueError, match="level must be 'batch' or 'example'"):
        defense_from_function("test_plugins_level", ok, level="client")
    assert DEFENSES.peek("test_plugins_varargs") is None


# --- the entry-point rule, in this process --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Misnamed(Defense):
    """A defense whose name is not its entry point's."""

    name: ClassVar[str] = "something_else"


@pytest.mark.parametrize(
    ("entry_name", "attr", "needle"),
    [
        ("test_plugins_fn", "scale", None),  # a plain function is adopted as a function defense
        ("test_plugins_cls", "Misnamed", "set it to 'test_plugins_cls', the entry-point name"),
        ("gaussian", "scale", "'gaussian' is already registered by another component"),
        ("test_plugins_int", "number", "the loaded int 3 cannot be registered"),
        ("test_plugins_gone", "missing", "failed to load: AttributeError"),
    ],
)
def test_entry_point_rule(
    entry_name: str,
    attr: str,
    needle: str | None,
    cleanup: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("lb_plugin_fake")
    module.scale = lambda grads: [g * 2 for g in grads]  # type: ignore[attr-defined]
    module.Misnamed = _Misnamed  # type: ignore[attr-defined]
    module.number = 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lb_plugin_fake", module)
    entry = importlib.metadata.EntryPoint(
        name=entry_name, value=f"lb_plugin_fake:{attr}", group="leakbench.defenses"
    )
    if entry_name != "gaussian":
        cleanup.append(entry_name)
    before = DEFENSES.names()

    if needle is None:
        plugins._load_entry(entry, plugins._attached["leakbench.defenses"])
        assert DEFENSES.get(entry_name).function is module.scale
        return
    with pytest.raises(plugins.PluginError) as info:
        plugins._load_entry(entry, plugins._attached["leakbench.defenses"])
    message = str(info.value)
    assert message.startswith(f"plugin entry point '{entry_name} = lb_plugin_fake:{attr}'")
    assert needle in message and "\n" not in message
    assert DEFENSES.names() == before


L1_PLUGIN = '''\
"""A demo plugin matching loss: the L1 distance between the two gradients, registered as abs."""

from __future__ import annotations

import tensorflow as tf


def l1_distance(dummy, observed):
    """Sum of absolute differences over every gradient tensor, per problem."""
    return tf.add_n(
        [
            tf.reduce_sum(tf.abs(d - o), axis=list(range(1, len(d.shape))))
            for d, o in zip(dummy, observed, strict=True)
        ]
    )
'''
SIGN_PLUGIN = '''\
"""A demo plugin defense: the sign of every gradient entry, scaled by the mean magnitude."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.defenses import Defense


@dataclasses.dataclass(frozen=True)
class Sign(Defense):
    """Shares each tensor's signs times its mean absolute entry (signSGD with a scale).

    Reference:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems", ICML 2018.
    """

    name: ClassVar[str] = "sign"

    def __call__(self, grads, *, seed):
        del seed  # deterministic
        return [tf.sign(g) * tf.reduce_mean(tf.abs(g)) for g in grads]
'''
L1_RUN = """\
name = "abs"
dataset = "digits"
suite = "listed"
images = 2

[[attack]]
name = "dlg"
loss = "abs"
iterations = 50

[[attack]]
name = "dlg"
iterations = 50

[[defense]]
name = "none"

[[defense]]
name = "sign"

[training]
enabled = false
"""


def test_a_plugin_matching_loss_and_a_plugin_defense_run_with_no_core_change(
    tmp_path: Path,
) -> None:
    """Each plugin is one file of a temporary package; nothing of leakbench is edited."""
    site = tmp_path / "site"
    site.mkdir()
    entry = "[leakbench.losses]\nabs = lb_plugin_l1:l1_distance\n"
    _install(site, "lb_plugin_l1", L1_PLUGIN, entry)
    _install(
        site, "lb_plugin_sign", SIGN_PLUGIN, "[leakbench.defenses]\nsign = lb_plugin_sign:Sign\n"
    )
    listed = _run_cli(site, tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    assert "one of abs, cosine, l1, l2" in listed.stdout  # dlg's loss parameter lists the plugin
    assert "  sign " in listed.stdout.split("defenses:\n", 1)[1]
    config = tmp_path / "l1.toml"
    config.write_text(L1_RUN, encoding="utf-8")
    out = tmp_path / "out"
    proc = _run_cli(site, tmp_path, "run", str(config), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    trials = pd.read_csv(out / "trials.csv")
    losses = trials["attack_params"].map(lambda text: json.loads(text)["loss"])
    assert set(losses) == {"abs", "l2"} and set(trials["defense"]) == {"none", "sign"}
    assert set(trials["status"]) == {"ok"}
    # The plugin loss is the one minimised: at the end of its search the L1 attack's reported
    # matching loss differs from the L2 attack's on the same images (the two distances of one
    # pair of gradients are different numbers).
    plain = trials[trials["defense"] == "none"]
    by_loss = {n: plain[losses[plain.index] == n]["loss"].to_numpy() for n in ("abs", "l2")}
    assert not np.allclose(by_loss["abs"], by_loss["l2"])
    # A loss name that nothing registers is refused in one line naming what is allowed.
    config.write_text(L1_RUN.replace('loss = "abs"', 'loss = "l3"'), encoding="utf-8")
    proc = _run_cli(site, tmp_path, "run", str(config), "--out", str(tmp_path / "bad"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "leakbench: error: attack dlg: loss must be a registered matching loss: one of abs, "
        "cosine, l1, l2, got 'l3'"
    ]
