"""What a run or a report was made with: the engine version (`leakbench.core.versions`), the code's
git commit, library versions, machine, devices and the date."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leakbench.core.versions import ENGINE_VERSION

ENVIRONMENT_FILE = "environment.json"
_PACKAGES = ("leakbench", "tensorflow", "keras", "numpy", "pandas", "matplotlib")


def describe_environment() -> dict[str, Any]:
    """Versions of the packages that decide the numbers, the machine, TensorFlow's devices and
    the current UTC time (ISO 8601)."""
    import tensorflow as tf

    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "engine_version": ENGINE_VERSION,
        **describe_commit(),
        "python": sys.version.split()[0],
        **versions,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        **describe_cpu(),
        "devices": [d.name for d in tf.config.list_logical_devices()],
    }


NOT_RECORDED = "not recorded"
# Seconds one git call may take before the commit is given up as not recorded.
_GIT_TIMEOUT = 10.0


def _git(folder: Path, *arguments: str) -> str | None:
    """The output of ``git -C folder ARGUMENTS`` (stripped), None when git is absent, fails or
    hangs. Local commands only: nothing here reaches the network."""
    executable = shutil.which("git")
    if executable is None:
        return None
    try:
        done = subprocess.run(
            [executable, "-C", str(folder), *arguments],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# The checkout's folders of outputs, left out of ``dirty`` (pathspecs from the checkout's top).
OUTPUT_FOLDERS = (":(top,exclude)results", ":(top,exclude)docs")


def describe_commit(folder: Path | None = None) -> dict[str, Any]:
    """The git commit of the checkout the code was imported from (``folder``: default, this
    package's folder): ``{"commit": SHA, "dirty": bool}``, dirty when ``git status
    --porcelain`` lists anything outside the checkout's ``results/`` and ``docs/`` (what runs
    and the board write, which no number depends on: a run regenerated in place would
    otherwise call its own output an uncommitted change); ``{"commit": "not recorded"}`` where
    the folder is in no git checkout, its files are not tracked there (an installed copy inside
    another repository), or git is absent. Never raises: a run does not fail for want of its
    commit."""
    where = Path(__file__).resolve().parent if folder is None else Path(folder)
    commit = _git(where, "rev-parse", "--verify", "HEAD")
    tracked = _git(where, "ls-files", "--", ".")
    if not commit or not tracked:
        return {"commit": NOT_RECORDED}
    status = _git(where, "status", "--porcelain", "--", ":/", *OUTPUT_FOLDERS)
    return {"commit": commit, "dirty": bool(status)}


# The instruction-set extensions that decide which oneDNN kernels TensorFlow runs on x86, and so
# the last bits of a number: two machines with the same versions but a different entry here
# need not give bit-identical results (docs/reproducibility.md).
_KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def describe_cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The processor's model name and which of the kernel-deciding extensions it has, read from
    ``/proc/cpuinfo`` (or the text ``cpuinfo``); ``platform.processor()`` and no flags where
    that file is absent (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {"cpu": platform.processor() or None, "cpu_flags": None}
    model: str | None = None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"cpu": model, "cpu_flags": [f for f in _KERNEL_FLAGS if f in flags]}


RUN_RECORD_FILE = "run.json"


def write_run_record(folder: Path, outputs: str, command: str) -> Path:
    """Records in ``folder/run.json`` what made the files ``outputs`` of a benchmark script (not
    a run directory, which has ``environment.json``): the environment and engine version of
    this process, and ``command`` under ``commands[outputs]``. Commands recorded earlier for
    other outputs of the same folder are kept; the environment is this process's."""
    path = Path(folder) / RUN_RECORD_FILE
    commands: dict[str, str] = {}
    if path.is_file():
        commands = dict(json.loads(path.read_text(encoding="utf-8")).get("commands", {}))
    commands[outputs] = command
    record = {**describe_environment(), "commands": commands}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def script_command(script: str, argv: Sequence[str] | None = None) -> str:
    """The command line of a benchmark script as a user runs it from the repository root:
    ``PYTHONSAFEPATH=1 python benchmarks/<name> <arguments>``, the arguments being ``argv`` or,
    when None, this process's."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["PYTHONSAFEPATH=1 python", f"benchmarks/{Path(script).name}", *arguments])


def cli_executable() -> str:
    """The ``leakbench`` command of this interpreter's environment (the script pip installs beside
    ``python``), so that a benchmark script run as ``.venv/bin/python benchmarks/...`` starts the
    same installation without that environment on ``PATH``; plain ``leakbench`` when there is
    none (a PATH lookup, as before)."""
    beside = Path(sys.executable).with_name("leakbench")
    return str(beside) if beside.is_file() else "leakbench"


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and initialises its devices with the C++ stderr muted.

    TensorFlow's native start-up lines ("Could not find cuda drivers", "failed call to cuInit")
    are written before its logging is configured, so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them.
    Python-level errors still surface: they are raised after stderr is restored.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            import tensorflow as tf

            tf.config.list_physical_devices()
            # TensorFlow's "N of the last N calls triggered retracing" warning counts traces by
            # source location, so the one observer per defense configuration (each traced once,
            # as it must be) reads as retracing. Real graph growth is measured instead: the
            # `traces` column of utility.csv and tests/test_training_graph.py.
            tf.get_logger().setLevel("ERROR")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
