"""One writer per run directory: a second `leakbench run` on a held --out is refused, and a
killed holder's lock is taken over."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from configs import run_config

from leakbench.core.errors import ConfigError
from leakbench.run.lock import HOLDER_FILE, LOCK_FILE, hold_run_dir

CLI = "import sys; from leakbench.cli import main; sys.exit(main())"


def _leakbench(*args: str) -> list[str]:
    return [sys.executable, "-c", CLI, *args]


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, "the holder ended before taking the lock"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_a_second_run_is_refused_and_a_killed_holders_lock_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # A run that holds --out for minutes: ig with 100,000 steps on one digit.
    slow = tmp_path / "slow.toml"
    slow.write_text(run_config("slow", images=1, attacks=({"name": "ig", "iterations": 100_000},)))
    quick = tmp_path / "quick.toml"
    quick.write_text(run_config("quick", images=1))
    holder = subprocess.Popen(_leakbench("run", str(slow), "--out", str(out), "--quiet"))
    try:
        _wait_for(out / HOLDER_FILE, holder)
        second = subprocess.run(
            _leakbench("run", str(slow), "--out", str(out), "--quiet"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 2
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert f"is in use by pid {holder.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr + second.stdout
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the killed holder's lock; its holder record is stale and ignored.
    assert (out / HOLDER_FILE).exists()
    third = subprocess.run(
        _leakbench("run", str(quick), "--out", str(out), "--quiet", "--extend"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert third.returncode == 0, third.stderr
    assert not (out / HOLDER_FILE).exists()  # removed on release


def test_a_refused_run_leaves_no_directory_behind(tmp_path: Path) -> None:
    out = tmp_path / "new"
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match="not a writable"), hold_run_dir(tmp_path / "file" / "x"):
        pass
    with pytest.raises(RuntimeError), hold_run_dir(out):
        assert json.loads((out / HOLDER_FILE).read_text())["pid"] > 0
        raise RuntimeError("the run failed before writing anything")
    assert not out.exists()
    with hold_run_dir(out):
        (out / "config.toml").write_text("kept")
    assert sorted(p.name for p in out.iterdir()) == sorted(["config.toml", LOCK_FILE])


def test_waiting_gives_one_notice_and_then_holds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = (
        "import sys, time; from pathlib import Path; from leakbench.run.lock import hold_run_dir\n"
        "with hold_run_dir(Path(sys.argv[1])):\n"
        "    print('held', flush=True); time.sleep(3)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        notices: list[str] = []
        start = time.monotonic()
        with hold_run_dir(out, wait=True, notice=notices.append):
            waited = time.monotonic() - start
        assert len(notices) == 1 and f"waiting for pid {holder.pid}" in notices[0]
        assert waited > 0.5
    finally:
        holder.kill()
        holder.wait()
