"""Acceptance: ``--backend ray`` on a local Ray instance gives the local backend's tables.

The local reference runs in-process. One Ray run starts its own private instance (checked to
be on 127.0.0.1 and stopped afterwards); the other joins a cluster started with ``ray start
--head`` on 127.0.0.1 through ``--address``, and one of its workers dies mid-run. Both have two
CPUs (two actors, for a 2-core CI machine). Every user error of the backend is one line and
exit status 2.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from configs import run_config  # noqa: E402

from leakbench.cli import main  # noqa: E402
from leakbench.integrations import ray_backend  # noqa: E402
from leakbench.outputs.tables import TIMING_COLUMNS  # noqa: E402

SEEDS = (0, 1)
IMAGES = 2
TRIALS = 2 * IMAGES * len(SEEDS)  # analytic x (none, gaussian), one image per trial
TRAININGS = 2 * len(SEEDS) * 2  # two defenses, two replicates each
# Two groups per seed, four in all: both actors get work, and one can die on its first group.
# The analytic attack on the MLP compiles no optimisation loop, so each actor's start-up (not
# an XLA compile per process) is most of a run's time.
CONFIG = run_config(
    "clustered",
    images=IMAGES,
    seeds=SEEDS,
    model="mlp",
    parallel_trials=2,
    attacks=({"name": "analytic"},),
    defenses=({"name": "none"}, {"name": "gaussian", "sigma": 1e-1}),
    training={"epochs": 1, "batch_size": 256, "seeds": 2, "learning_rates": [1e-3]},
)
TABLES = ("trials.csv", "utility.csv", "leaderboard.csv")
# The cluster's token, given to the head and the driver alike: `ray start` made one itself up to
# Ray 2.54, and since 2.55 refuses to start with token authentication and no token.
TOKEN_ENV = {"RAY_AUTH_TOKEN": uuid.uuid4().hex}
# Seconds for `ray start --head` to come up on a loaded machine (about 7 s here).
HEAD_TIMEOUT = 120
# Seconds for a driver process to run the config on Ray (about 30 s here).
RUN_TIMEOUT = 300
# What identifies one image of one trial: each must occur once in trials.csv.
ROW_KEY = [
    "seed", "batch_index", "position", "attack", "attack_params", "defense", "defense_params",
]  # fmt: skip


class Result(NamedTuple):
    code: int | str | None
    out: str
    err: str


def _main(*argv: str | Path) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "clustered.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def local(config: Path) -> Path:
    """The run on the local backend (the reference)."""
    out = config.parent / "local"
    result = _main("run", config, "--out", out, "--quiet")
    assert result.code == 0, result.err
    return out


@pytest.fixture()
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A private Ray instance of two CPUs; yields the node addresses each run started on."""
    monkeypatch.setattr(ray_backend, "LOCAL_NUM_CPUS", 2)
    started = ray_backend._start_loopback
    nodes: list[str] = []

    def start(*args: object) -> None:
        started(*args)
        nodes.extend(node["NodeManagerAddress"] for node in ray.nodes())
        nodes.append(ray.get_runtime_context().gcs_address.rsplit(":", 1)[0])

    monkeypatch.setattr(ray_backend, "_start_loopback", start)
    yield nodes
    assert not ray.is_initialized()  # the private instance is stopped after the run


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def _arrays(out: Path) -> dict[str, dict[str, np.ndarray]]:
    arrays = {}
    for path in sorted((out / "arrays").iterdir()):
        with np.load(path, allow_pickle=False) as data:
            arrays[path.name] = {name: data[name] for name in data.files}
    return arrays


def _assert_same_run(reference: Path, out: Path) -> None:
    for table in TABLES:
        frames = [_without_timing(pd.read_csv(d / table)) for d in (reference, out)]
        pd.testing.assert_frame_equal(*frames, obj=table)
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == TRIALS and trials.groupby(ROW_KEY).size().max() == 1
    assert len(pd.read_csv(out / "utility.csv")) == TRAININGS
    expected, got = _arrays(reference), _arrays(out)
    assert got.keys() == expected.keys() and expected
    for name, data in expected.items():
        assert got[name].keys() == data.keys(), name
        for key, value in data.items():
            np.testing.assert_array_equal(got[name][key], value, err_msg=f"{name}: {key}")


def test_ray_backend_gives_the_local_tables(config: Path, local: Path, two_cpus: list[str]) -> None:
    out = config.parent / "ray"
    result = _main("run", config, "--out", out, "--quiet", "--backend", "ray")

    assert result.code == 0, result.err
    assert result.out.startswith(f"{TRIALS} trials run, 0 reused; {TRAININGS} trainings run")
    assert two_cpus and set(two_cpus) == {"127.0.0.1"}
    _assert_same_run(local, out)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[str]:
    """A two-CPU Ray cluster started as a user would (``ray start --head``) on 127.0.0.1, with
    Ray's token authentication; yields its address."""
    port = _free_port()
    env = dict(
        os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token", **TOKEN_ENV
    )
    log = tmp_path / "head.log"
    command = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
        f"--port={port}", "--num-cpus=2", "--node-ip-address=127.0.0.1",
        "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    with open(log, "wb") as sink:
        head = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HEAD_TIMEOUT
        while "Ray runtime started" not in log.read_text(errors="replace"):
            assert head.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "ray start --head did not come up in time"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # `ray start --block` stops the cluster's processes on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def test_a_worker_that_dies_mid_run_costs_only_its_group(
    config: Path, local: Path, cluster: str
) -> None:
    crashed = config.parent / "crashed"
    out = config.parent / "ray-crash"
    # A fresh driver process, as a user's: Ray reads RAY_AUTH_MODE when it is imported.
    env = dict(
        os.environ,
        PYTHONSAFEPATH="1",
        RAY_AUTH_MODE="token",  # how a driver joins a cluster with token authentication
        **TOKEN_ENV,
        # The first actor to attack a group exits in the middle of it (after the trainings).
        **{ray_backend.CRASH_ONCE_ENV: str(crashed)},
    )
    command = [sys.executable, "-m", "leakbench.cli", "run", str(config), "--out", str(out)]
    result = subprocess.run(
        [*command, "--quiet", "--backend", "ray", "--address", cluster],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )

    assert result.returncode == 0, result.stderr
    # Ray reports the dead worker on stdout before the summary line.
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{TRIALS} trials run, 0 reused; {TRAININGS} trainings run")
    assert crashed.exists()
    _assert_same_run(local, out)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backend", "spark"], "argument --backend: invalid choice: 'spark'"),
        (["--address", "127.0.0.1:6379"], "--address needs --backend ray"),
        (["--backend", "ray", "--address", "head"], "--address must be HOST:PORT"),
        (["--backend", "ray", "--address", "127.0.0.1:{port}"], "no Ray cluster answers"),
    ],
)
def test_backend_errors_are_one_line(
    config: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    out = tmp_path / "out"
    argv = [a.replace("{port}", str(_free_port())) for a in args]
    result = _main("run", config, "--out", out, *argv)

    assert result.code == 2 and result.out == ""
    assert len(result.err.splitlines()) == 1 and needle in result.err, result.err
    assert not out.exists()


def test_ray_backend_without_the_extra(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    out = tmp_path / "out"
    result = _main("run", config, "--out", out, "--backend", "ray")

    assert result.code == 2 and result.out == ""
    assert result.err == (
        "leakbench: error: --backend ray needs the ray extra: pip install 'leakbench[ray]'\n"
    )
    assert not out.exists()
