"""One writer per run directory: the lock that `leakbench run` and `leakbench merge` hold.

Two processes writing one run directory would attack the same trials twice and race on its
tables. The writer holds an operating-system lock on ``DIR/.leakbench.run.lock`` (``filelock``:
``flock`` on Unix), which the kernel releases when the process ends, however it ends, so a lock
left by a killed run is taken over by the next one without any stale-lock guessing. Beside it,
``DIR/.leakbench.holder.json`` names the holder (pid, host, start time, command) for the message
a refused process prints; it is informative only, never what decides who holds the lock.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from leakbench.core.errors import ConfigError

LOCK_FILE = ".leakbench.run.lock"
HOLDER_FILE = ".leakbench.holder.json"


def describe_holder(out: Path) -> str:
    """Who holds ``out``, from its holder record ("pid 123 on host h since ..."), or a plain
    "another process" when the record is missing or unreadable."""
    try:
        record = json.loads((out / HOLDER_FILE).read_text(encoding="utf-8"))
        return (
            f"pid {int(record['pid'])} on host {record['host']} since {record['since']} "
            f"({record['command']})"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def hold_run_dir(
    out: Path, *, wait: bool = False, notice: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Holds ``out`` for the duration of the block, creating it if needed.

    Raises `ConfigError` (one line naming the holder) when another live process holds it,
    unless ``wait``: then ``notice`` gets one line and the call blocks until the holder is
    done. A directory this call created is removed again if the block fails while the lock
    files are all it holds, so a refused run leaves nothing behind.
    """
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out / LOCK_FILE))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            holder = describe_holder(out)
            if not wait:
                raise ConfigError(
                    f"--out {out} is in use by {holder}; wait for it to finish, or pass --wait"
                ) from None
            if notice is not None:
                notice(f"waiting for {holder} to release --out {out}")
            lock.acquire()
    except OSError as err:
        _remove_if_bare(out, created)
        raise ConfigError(f"--out {out} is not a writable directory: {err.strerror}") from None
    except ConfigError:
        _remove_if_bare(out, created)
        raise
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["leakbench", *sys.argv[1:2]]),
    }
    failed = True
    try:
        (out / HOLDER_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")
        yield
        failed = False
    finally:
        with contextlib.suppress(OSError):
            (out / HOLDER_FILE).unlink()
        lock.release()
        if failed:
            _remove_if_bare(out, created)


def _remove_if_bare(out: Path, created: bool) -> None:
    """Removes ``out`` if this process created it and nothing but lock files is in it."""
    if not created or not out.is_dir():
        return
    if {p.name for p in out.iterdir()} <= {LOCK_FILE, HOLDER_FILE}:
        shutil.rmtree(out, ignore_errors=True)
