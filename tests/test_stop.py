"""A ``kill`` (SIGTERM) stops a command as Ctrl-C does (`leakbench.core.stopping`).

Before, SIGTERM's default action ended ``leakbench run`` where it stood: its worker processes
computed on for nobody (one for 56 CPU minutes), and the board's coverage driver, which reads
the CPU time of its finished children, never counted theirs. Now the run stops its workers,
prints one line and exits with 143; a handler that was not the default (``nohup``'s ignored
SIGHUP) is kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf
from configs import run_config
from test_resume import _entries

import leakbench.cli
from leakbench.attacks.engine import lanes
from leakbench.cli import main
from leakbench.core.stopping import Stopped, stop_on_signals

# Enough groups (one trial each) that the signal lands while both workers attack.
IMAGES = 16
CONFIG = run_config(
    "stopped",
    images=IMAGES,
    seeds=(0, 1),
    parallel_trials=1,
    attacks=({"name": "idlg", "iterations": 300},),
)
# Seconds to wait for the first stored trial (the workers import TensorFlow and compile first),
# and for the stopped run to exit.
START_TIMEOUT = 300
STOP_TIMEOUT = 60


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended while we looked
                continue
            # The fields after the command name, which is in parentheses and may hold spaces.
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_sigterm_returns_143_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def killed(_args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(leakbench.cli, "_run", killed)
    assert main(["run", "unused.toml"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == (
        "leakbench: stopped by SIGTERM; rerun the same command to resume\n"
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored on return


def test_a_handler_found_on_entry_is_kept() -> None:
    kept = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))
            with pytest.raises(Stopped) as caught:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            assert caught.value.exit_status == 143
            # While the stack unwinds, a second signal is ignored.
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, kept)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_a_killed_run_stops_its_workers(tmp_path: Path) -> None:
    config = tmp_path / "stopped.toml"
    config.write_text(CONFIG, encoding="utf-8")
    out, log = tmp_path / "out", tmp_path / "run.log"
    command = [sys.executable, "-m", "leakbench.cli", "run", str(config), "--out", str(out),
               "--quiet", "--workers", "2"]  # fmt: skip
    with open(log, "w") as err:
        proc = subprocess.Popen(command, env=dict(os.environ, PYTHONSAFEPATH="1"), stderr=err)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not _entries(out / "store.sqlite"):
                assert proc.poll() is None, f"the run ended unkilled:\n{log.read_text()}"
                assert time.monotonic() < deadline, "no trials stored in time"
                time.sleep(0.05)
            workers = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_TIMEOUT)
        finally:
            if proc.poll() is None:  # a failed assertion above must not leave it running
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert text.splitlines()[-1] == (
        "leakbench: stopped by SIGTERM; rerun the same command to resume"
    )
    assert len(workers) >= 2, workers  # the two workers (and nothing else must outlive it)
    deadline = time.monotonic() + 10  # an orphaned zombie is reaped by init
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived the stopped run"
    held = _entries(out / "store.sqlite")
    assert held is not None and 0 < len(held) < 2 * IMAGES, "the stop did not land mid-run"


@pytest.mark.parametrize("width", [2, 12])
def test_a_stop_while_lanes_run_starts_no_further_problem(width: int) -> None:
    # The LFW board cell runs its attacks in this process, on two lane threads, while the main
    # thread waits on them. A SIGTERM there used to raise `Stopped` and then wait for the pool,
    # which ran every queued lane (width 12: twelve lanes of one problem) and every lane's
    # queue (width 2: two lanes of six) to the end: minutes of attacks before the exit. Now the
    # lanes in flight finish their chunk and nothing else starts.
    calls = []
    lock = threading.Lock()

    def chunk(state, *_args):  # a chunk whose rows are done at once, 0.5 s later
        with lock:
            calls.append(1)
            first = len(calls) == 1
        time.sleep(0.25)  # every lane is queued by now; the main thread waits on them
        if first:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.25)
        return state

    count = 12
    problems = [
        lanes.Problem(tf.zeros([3]), (tf.zeros([1]),), (), tf.zeros([1])) for _ in range(count)
    ]
    plan = lanes.Plan(slots=1, threads=2, tail=0)
    with stop_on_signals(), pytest.raises(Stopped):
        lanes.solve(chunk, problems, width=width, plan=plan, history_size=2, max_iterations=5)
    assert 1 <= len(calls) <= plan.threads, f"{len(calls)} chunks ran for a stopped solve"
