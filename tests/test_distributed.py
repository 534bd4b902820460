"""The defended trainer on loopback clusters: parameter servers and multi-worker all-reduce.

Each cluster runs in fresh processes (`distributed_worker.py`): TensorFlow's servers cannot be
stopped once started and would change this process's eager context. Every wait is bounded: the
script dumps its stacks and exits after ``WORKER_TIMEOUT`` seconds, and the test kills it after
``KILL_TIMEOUT``. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import pytest

from leakbench.client.training import DefendedTrainer
from leakbench.components.models import build_model
from leakbench.defenses import make_defense

SCRIPT = Path(__file__).with_name("distributed_worker.py")
STEPS, PERIOD, PHASE = 12, 4, 2  # as in distributed_worker.py
POISONED = [t % PERIOD == PHASE for t in range(STEPS)]
WORKER_TIMEOUT = 150  # generous for a loaded 2-core box; a run takes 20-45 s here
KILL_TIMEOUT = WORKER_TIMEOUT + 30
_PROXIES = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy")


def _loopback_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (held together while picked, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture(autouse=True)
def _needs_loopback() -> None:
    try:
        _loopback_ports(1)
    except OSError as err:
        pytest.skip(f"cannot bind a TCP port on 127.0.0.1 here: {err}")


def _env(tf_config: dict | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in _PROXIES and k != "TF_CONFIG"  # gRPC would send loopback to a proxy
    }
    env.update(PYTHONSAFEPATH="1", CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="2")
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _start(mode: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), mode, "--timeout", str(WORKER_TIMEOUT)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reports(procs: list[subprocess.Popen]) -> list[dict]:
    """Waits for every process until one deadline, kills what is left, returns their reports."""
    deadline = time.monotonic() + KILL_TIMEOUT
    try:
        outputs = [
            proc.communicate(timeout=max(1.0, deadline - time.monotonic())) for proc in procs
        ]
    except subprocess.TimeoutExpired:
        pytest.fail(f"a cluster process did not finish within {KILL_TIMEOUT} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{err[-3000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def test_parameter_server_strategy_skips_nonfinite_steps_on_the_worker() -> None:
    """Coordinator + two workers + one parameter server; the defense poisons t % 4 == 2."""
    (report,) = _reports([_start("ps", _env())])
    assert report["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    # Twelve steps in flight at once: the coordinator numbers them, so the poisoned ones are
    # known whichever worker ran them, and only those were skipped.
    assert report["skipped"] == POISONED
    assert report["finite_loss"]
    assert report["steps"] == STEPS
    assert report["skipped_steps"] == sum(POISONED)
    # Keras 3 increments `iterations` by read-modify-write, so concurrent updates from two
    # workers can lose an increment (seen here: 8 of 9); it never counts a skipped step.
    assert 1 <= report["iterations"] <= STEPS - sum(POISONED)
    # Then one step at a time (steps 12-15, step 14 poisoned): a skipped step leaves weights,
    # slots and the iteration count bit-identical; the others update.
    assert report["checked"] == [
        {"skipped": t % PERIOD == PHASE, "unchanged": t % PERIOD == PHASE}
        for t in range(STEPS, STEPS + 4)
    ]
    assert report["final_steps"] == STEPS + 4
    assert report["final_skipped_steps"] == sum(POISONED) + 1
    assert report["finite_weights"]
    assert report["traces"] == 1


def test_multi_worker_mirrored_skips_on_every_worker_when_one_replica_is_nonfinite() -> None:
    """Two worker processes; only replica 1's defended gradient is NaN on t % 4 == 2."""
    workers = [f"127.0.0.1:{port}" for port in _loopback_ports(2)]
    procs = [
        _start(
            "mwms",
            _env({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}),
        )
        for i in range(2)
    ]
    reports = _reports(procs)
    for report in reports:
        assert report["replicas"] == 2
        assert report["skipped"] == POISONED
        assert report["unchanged"] == POISONED  # bit-identical weights, slots and iterations
        assert report["steps"] == STEPS
        assert report["skipped_steps"] == sum(POISONED)
        assert report["iterations"] == STEPS - sum(POISONED)
        assert report["finite_weights"]
        assert report["traces"] == 1
    assert reports[0]["checksum"] == reports[1]["checksum"]


def test_schedule_needs_a_parameter_server_strategy() -> None:
    model = build_model("mlp", (8, 8, 1), 10, seed=0)
    trainer = DefendedTrainer(
        model, make_defense("none"), keras.optimizers.SGD(0.1), num_classes=10, seed=0
    )
    with pytest.raises(TypeError, match="ParameterServerStrategy"):
        trainer.schedule(None, None)
