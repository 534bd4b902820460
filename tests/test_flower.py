"""The Flower integration (`leakbench.integrations.flower`, the ``flower`` extra): defenses as
client mods, the leakage auditor, and the example app in Flower's simulation engine.

The mod and the client's step are checked on hand-made messages against leakbench's own client
path, bit for bit. The simulation runs ``examples/flower/run_simulation.py`` in a subprocess
(its own Ray instance on 127.0.0.1, every wait bounded): 4 clients, 2 rounds, the auditor on
client 0 in round 1, once without a defense and once under ``gaussian`` (sigma 0.1). The
deployment test runs the same app on a SuperLink and two SuperNodes on 127.0.0.1, always
stopped (each in a session of its own, ended by id).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

pytest.importorskip("flwr", reason="the flower extra is not installed: pip install '.[flower]'")

from flwr.app import Context, Message, MessageType, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from leakbench.client import local_change, observer  # noqa: E402
from leakbench.components.models import build_model  # noqa: E402
from leakbench.core.errors import ConfigError, LeakbenchError, UnknownNameError  # noqa: E402
from leakbench.core.federated import LocalTraining  # noqa: E402
from leakbench.defenses import make_defense  # noqa: E402
from leakbench.integrations import flower  # noqa: E402
from leakbench.outputs.tables import LEADERBOARD_COLUMNS, TRIAL_COLUMNS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower" / "run_simulation.py"
# Seconds for one simulation run (about 30 s on 2 shared cores: Ray, one actor, one attack).
SIMULATION_TIMEOUT = 300


@pytest.fixture(autouse=True, scope="module")
def _task_identity():
    """Messages are made outside a Flower process here, which needs a task identity."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _message(model, local: LocalTraining, rnd: int, batch: int) -> Message:
    content = RecordDict(
        {"arrays": flower.model_record(model), "config": flower.train_config(local, batch)}
    )
    content["config"]["server-round"] = rnd
    return Message(content, dst_node_id=5, message_type=MessageType.TRAIN)


def _context(partition: int) -> Context:
    return Context(1, 5, {"partition-id": partition}, RecordDict(), {})


def _sent(msg: Message) -> list[np.ndarray]:
    return flower.record_arrays(msg.content["arrays"])


def _returned(reply: Message) -> list[np.ndarray]:
    return flower.record_arrays(reply.content["arrays"])


@pytest.mark.parametrize("steps", [1, 2])
def test_the_mod_sends_leakbench_s_defended_update_bit_for_bit(digits, steps: int) -> None:
    server = build_model("lenet", digits.input_shape, 10, seed=3)
    local = LocalTraining(steps, 0.1)
    x, y = digits.train.x[:2], digits.train.y[:2]
    msg = _message(server, local, rnd=3, batch=2)
    client = flower.LocalClient.shared("lenet", input_shape=digits.input_shape, num_classes=10)
    mod = flower.DefenseMod("gaussian", sigma=0.1, seed=7)
    reply = mod(msg, _context(2), lambda m, c: client.reply(m, c, x, y))

    # leakbench's own client path, same model, batch and key (seed 7, round 3, client 2).
    model = build_model("lenet", digits.input_shape, 10, seed=3)
    key = flower.round_draw(7, 3, 2)
    defense = make_defense("gaussian", sigma=0.1)
    images, targets = tf.constant(x), tf.one_hot(y, 10)
    if local.fedsgd:
        # One step: leakbench's FedAvg client defends the weight change w0 - w1.
        expected = defense.apply(local_change(model, images, targets, local), seed=key)
    else:
        expected = observer(defense, model, local)(images, targets, key)
    for w0, got, change in zip(_sent(msg), _returned(reply), expected, strict=True):
        np.testing.assert_array_equal(got, np.asarray(tf.constant(w0) - change))
    defended, _ = mod.defend(_sent(msg), client.train(_sent(msg), x, y, local, 2, 3), 2, 3)
    for got, change in zip(defended, expected, strict=True):
        np.testing.assert_array_equal(got, np.asarray(change))
    record = reply.content["leakbench"]
    assert (record["client"], record["round"], record["defense"]) == (2, 3, "gaussian")
    assert json.loads(record["defense-params"]) == {"sigma": 0.1}


def test_an_example_level_defense_runs_in_the_client_s_step(digits) -> None:
    server = build_model("lenet", digits.input_shape, 10, seed=3)
    local = LocalTraining(1, 0.5)
    x, y = digits.train.x[:4], digits.train.y[:4]
    msg = _message(server, local, rnd=1, batch=4)
    client = flower.LocalClient.shared(
        "lenet", input_shape=digits.input_shape, num_classes=10,
        defense="dpsgd", norm=1.0, noise_multiplier=0.5, seed=11,
    )  # fmt: skip
    reply = client.reply(msg, _context(1), x, y)
    model = build_model("lenet", digits.input_shape, 10, seed=3)
    defense = make_defense("dpsgd", norm=1.0, noise_multiplier=0.5)
    grads = observer(defense, model, local)(
        tf.constant(x), tf.one_hot(y, 10), flower.round_draw(11, 1, 1)
    )
    for w0, got, g in zip(_sent(msg), _returned(reply), grads, strict=True):
        np.testing.assert_array_equal(got, np.asarray(tf.constant(w0) - 0.5 * g))
    assert reply.content["leakbench"]["where"] == "client step"
    with pytest.raises(ConfigError, match="LocalClient"):
        flower.DefenseMod("dpsgd", norm=1.0, noise_multiplier=0.5)


def test_rounds_reuse_one_trace_although_flower_rebuilds_the_mod(digits) -> None:
    server = build_model("lenet", digits.input_shape, 10, seed=0)
    local = LocalTraining(1, 0.1)
    client = flower.LocalClient.shared("lenet", input_shape=digits.input_shape, num_classes=10)
    counts = []
    for rnd in range(1, 6):
        mod = flower.DefenseMod("laplace", b=0.01)  # a new mod per message, as Flower does
        msg = _message(server, local, rnd=rnd, batch=1)
        x, y = digits.train.x[rnd : rnd + 1], digits.train.y[rnd : rnd + 1]
        mod(msg, _context(rnd % 4), lambda m, c, x=x, y=y: client.reply(m, c, x, y))
        counts.append((mod.tracing_count(), client.tracing_count()))
    # The client may have traced other batch shapes in earlier tests (it is the process's).
    assert counts == [(1, counts[0][1])] * 5


@pytest.mark.parametrize(
    ("build", "error", "needle"),
    [
        (lambda: flower.DefenseMod("gausian", sigma=0.1), UnknownNameError, "gausian"),
        (lambda: flower.DefenseMod("gaussian", sigma=-1.0), ConfigError, "sigma"),
        (lambda: flower.DefenseMod("gaussian", sigma=0.1, seed=-1), ConfigError, "seed"),
        (lambda: flower.DefenseMod("soteria", share=0.5), ConfigError, "LocalClient"),
        (lambda: _auditor(attack="idlgg"), UnknownNameError, "idlgg"),
        (lambda: _auditor(attack_params={"iterations": 0}), ConfigError, "iterations"),
        (lambda: _auditor(attack="analytic"), ConfigError, "lenet"),
        (lambda: _auditor(batch_size=2), ConfigError, "batch_size"),
        (lambda: _auditor(rounds=[0]), ConfigError, "rounds"),
        (lambda: _auditor(model="nope"), UnknownNameError, "nope"),
    ],
)
def test_bad_input_is_one_line_before_any_round(
    build, error, needle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an auditor that got that far would create its out here
    with pytest.raises(error) as caught:
        build()
    text = str(caught.value)
    assert needle in text and "\n" not in text


def _auditor(**changes) -> flower.LeakageAuditor:
    kwargs = {"out": "audit", "private_data": lambda client, rnd: (None, None), **changes}
    return flower.LeakageAuditor(FedAvg(), **kwargs)


class _Grid:
    """The one node a test's FedAvg samples (node 5, as `_message` and `_context` use)."""

    def get_node_ids(self) -> list[int]:
        return [5]


# The columns a checkpoint's benchmark trial shares with the auditor's (not dataset, model and
# image_index, which name the files and the deployment's examples, nor the seconds).
SAME = [
    "run", "defense", "defense_params", "seed", "attack", "attack_params", "batch_index",
    "position", "batch_size", "label", "predicted_label", "mse", "psnr", "ssim", "lpips",
    "label_acc", "status", "loss", "iterations", "evaluations", "attempts", "iterations_used",
    "stop_reason",
]  # fmt: skip


@pytest.mark.parametrize(
    ("defense", "params", "steps"),
    [
        ("gaussian", {"sigma": 0.1}, 1),  # the example's: a DefenseMod under FedSGD
        ("dpsgd", {"norm": 1.0, "noise_multiplier": 0.5}, 1),  # in the client's step
    ],
)
def test_a_saved_round_attacked_as_a_benchmark_run_gives_the_auditor_s_numbers(
    digits, tmp_path: Path, defense: str, params: dict, steps: int
) -> None:
    local, rnd = LocalTraining(steps, 0.1), 3
    x, y = digits.train.x[7:8], digits.train.y[7:8]
    out = tmp_path / "audit"
    auditor = flower.LeakageAuditor(
        FedAvg(fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1),
        out=out, private_data=lambda client, r: (x, y, [7]), attack="idlg",
        attack_params={"iterations": 15}, rounds=[rnd], local=local, figures=False,
        save_models=True,
    )  # fmt: skip
    server = build_model("lenet", digits.input_shape, 10, seed=4)
    (msg,) = auditor.configure_train(
        rnd, flower.model_record(server), flower.train_config(local, 1), _Grid()
    )
    if flower.acts_on_update(make_defense(defense, **params)):
        client = flower.LocalClient.shared("lenet", input_shape=digits.input_shape, num_classes=10)
        mod = flower.DefenseMod(defense, seed=0, **params)
        reply = mod(msg, _context(0), lambda m, c: client.reply(m, c, x, y))
    else:
        client = flower.LocalClient.shared(
            "lenet", input_shape=digits.input_shape, num_classes=10, defense=defense, **params
        )
        reply = client.reply(msg, _context(0), x, y)
    auditor.aggregate_train(rnd, [reply])
    assert sorted(p.name for p in (out / "models").iterdir()) == [
        f"round-{rnd}-client-0.npz", f"round-{rnd}.keras"
    ]  # fmt: skip

    result = flower.attack_checkpoint(out, rnd, 0, out=tmp_path / "bench")
    audited = pd.read_csv(out / "trials.csv")
    bench = pd.read_csv(tmp_path / "bench" / "trials.csv")
    assert len(audited) == len(bench) == len(result.trials) == 1
    assert (bench.loc[0, "seed"], bench.loc[0, "batch_index"]) == (0, rnd)
    # Bit for bit: the same update, attack seed and arithmetic.
    pd.testing.assert_frame_equal(bench[SAME], audited[SAME], check_exact=True)
    assert (tmp_path / "bench" / "config.toml").read_text().count('shares = "weights"') == 1


def test_a_checkpoint_that_fails_to_save_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leakbench.integrations import flower_checkpoints

    model = build_model("lenet", (8, 8, 1), 10, seed=0)
    assert flower_checkpoints.save_model(model, tmp_path, 1) == "models/round-1.keras"
    before = (tmp_path / "models" / "round-1.keras").read_bytes()

    def half_written(self, path, *args, **kwargs):
        Path(path).write_bytes(b"PK half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(type(model), "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        flower_checkpoints.save_model(model, tmp_path, 1)
    with pytest.raises(OSError, match="disk full"):
        flower_checkpoints.save_model(model, tmp_path, 2)
    # The earlier checkpoint is intact, the failed one absent, no temporary file left.
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["round-1.keras"]
    assert (tmp_path / "models" / "round-1.keras").read_bytes() == before


def test_a_checkpoint_needs_seeds_a_benchmark_trial_draws(digits, tmp_path: Path) -> None:
    audit = {
        "deployment": "d", "lpips": "none", "batch_size": 1,
        "attack": {"name": "idlg", "params": {}},
        "threat_model": {"local_steps": 1, "local_lr": 0.1, "local_batch_size": 0,
                         "labels_known": False},
        "trials": [{"round": 1, "client": 2, "defense": "gaussian",
                    "defense_params": '{"sigma":0.1}', "defense_seed": 0, "where": "mod",
                    "model_file": "models/round-1.keras",
                    "batch_file": "models/round-1-client-2.npz"}],
    }  # fmt: skip
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    with pytest.raises(ConfigError, match="client 2 drew its gaussian noise") as caught:
        flower.attack_checkpoint(tmp_path, 1, 2)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"audited no update of client 0 in round 1"):
        flower.attack_checkpoint(tmp_path, 1, 0)
    audit["trials"][0].update(model_file=None)
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    with pytest.raises(ConfigError, match="save_models=True"):
        flower.attack_checkpoint(tmp_path, 1, 2)


def test_leakbench_without_flwr_names_the_extra() -> None:
    code = "import sys; sys.modules['flwr'] = None; import leakbench.integrations.flower"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONSAFEPATH="1", TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(flower.FLOWER_MISSING)
    assert issubclass(ConfigError, LeakbenchError)


def _run_example(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONSAFEPATH="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=SIMULATION_TIMEOUT,
    )  # fmt: skip


def test_the_example_refuses_a_bad_defense_in_one_line(tmp_path: Path) -> None:
    done = _run_example(tmp_path, "--defense", "gaussian", "--param", "sigma=-0.5")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert lines == [
        "run_simulation.py: error: defense gaussian: sigma must be in [0, inf), got -0.5"
    ], done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("defense", "recovered"),
    [(("--defense", "none"), True), (("--defense", "gaussian", "--param", "sigma=0.1"), False)],
)
def test_the_auditor_recovers_the_image_unless_the_clients_add_noise(
    tmp_path: Path, defense: tuple[str, ...], recovered: bool
) -> None:
    out = tmp_path / "audit"
    done = _run_example(tmp_path, *defense, "--rounds", "2", "--clients", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "flower_result.json").read_text())
    accuracy = result["accuracy"]
    assert sorted(accuracy) == ["0", "1", "2"] and all(0 <= a <= 1 for a in accuracy.values())
    assert "round 2: global model test accuracy" in done.stdout
    assert (out / "printed.txt").read_text() == done.stdout
    (trial,) = result["audit"]
    assert (trial["round"], trial["client"]) == (1, 0)
    if recovered:
        assert trial["psnr"] > 30, done.stdout
    else:
        assert trial["psnr"] < 20, done.stdout
    trials = pd.read_csv(out / "trials.csv")
    assert list(trials.columns) == TRIAL_COLUMNS and len(trials) == 1
    assert trials.loc[0, "defense"] == defense[1]
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.columns) == LEADERBOARD_COLUMNS
    # The auditor's board holds the clients' own defense only: `none` is the baseline row, and
    # with no `none` to show that the attack breaks the undefended model, an image the attack
    # missed proves nothing.
    assert board.loc[0, "verdict"] == ("baseline" if defense[1] == "none" else "inconclusive")
    audit = json.loads((out / "audit.json").read_text())
    assert audit["kind"] == "leakbench audit of a Flower deployment"
    assert (audit["rounds"], audit["clients"]) == ([1], [0])
    assert (out / "figures" / "reconstructions.png").is_file()
    assert "privacy_utility" in audit["figures_skipped"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the SuperLink exited with {process.returncode}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing answered on 127.0.0.1:{port} within {timeout:.0f} s")


def _stop(processes: list[subprocess.Popen]) -> None:
    """Ends each process's own session (it and the Flower processes it started), by id."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the session's leftovers too
        process.wait(timeout=10)


@pytest.mark.slow
def test_a_superlink_and_supernodes_on_loopback_run_the_audited_app(tmp_path: Path) -> None:
    """The example app through real Flower processes: a SuperLink and two SuperNodes on
    127.0.0.1 (ports picked free), the run submitted with ``flwr run``. Every round starts a
    new ClientApp process per node (TensorFlow imported anew), and the ServerApp runs in a
    process of its own: 49 to 83 s on 2 shared cores, hence ``slow``."""
    port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = dict(
        os.environ,
        FLWR_HOME=str(home),
        PYTHONSAFEPATH="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        # The SuperLink and SuperNodes start Flower's other executables by name.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    bin_dir = Path(sys.executable).parent
    logs, processes = [], []

    def start(name: str, *args: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")  # closed in the finally below
        logs.append(log)
        process = subprocess.Popen(
            [str(bin_dir / args[0]), *args[1:]], cwd=tmp_path, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        processes.append(process)
        return process

    out = tmp_path / "audit"
    try:
        link = start(
            "superlink", "flower-superlink", "--insecure", "--host", "127.0.0.1",
            "--port", str(port), "--disable-runtime-dependency-installation",
        )  # fmt: skip
        _wait_for_port(port, link, timeout=120)
        for client in range(2):
            start(
                f"supernode{client}", "flower-supernode", "--insecure",
                "--superlink", f"127.0.0.1:{port}", "--host", "127.0.0.1",
                "--port", str(_free_port()),
                "--node-config", f"partition-id={client} num-partitions=2",
            )  # fmt: skip
        overrides = f"num-clients=2 rounds=1 defense='none' defense-params='' out='{out}'"
        done = subprocess.run(
            [str(bin_dir / "flwr"), "run", str(EXAMPLE.parent), "loopback",
             "--run-config", overrides, "--stream"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420,
        )  # fmt: skip
    finally:
        _stop(processes)
        for log in logs:
            log.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "flower_result.json").is_file(), done.stdout[-3000:]
    result = json.loads((out / "flower_result.json").read_text())
    (trial,) = result["audit"]
    assert (trial["round"], trial["client"]) == (1, 0)
    assert trial["psnr"] > 30
    assert sorted(result["accuracy"]) == ["0", "1"]
    assert list(pd.read_csv(out / "trials.csv").columns) == TRIAL_COLUMNS
