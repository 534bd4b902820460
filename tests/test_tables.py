"""Atomic table writing: files get the permissions a plain open() gives, and importing the module
changes nothing in the process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from leakbench.core import files
from leakbench.outputs import tables


@pytest.fixture
def umask() -> Iterator[None]:
    """Puts the process's umask back after a test that sets its own."""
    saved = os.umask(0o022)
    os.umask(saved)
    try:
        yield
    finally:
        os.umask(saved)


def test_importing_tables_leaves_the_umask_alone() -> None:
    # In a fresh process: os.umask is watched from before the import, which must not call it.
    code = (
        "import os\n"
        "calls = []\n"
        "real = os.umask\n"
        "os.umask = lambda mask: calls.append(mask) or real(mask)\n"
        "real(0o027)\n"
        "before = real(0o027)\n"
        "import leakbench.outputs.tables\n"
        "after = real(0o027)\n"
        "print(calls, oct(before), oct(after))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=dict(os.environ, PYTHONSAFEPATH="1"),
    ).stdout
    assert out.split() == ["[]", "0o27", "0o27"]
    assert not hasattr(tables, "FILE_MODE")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_written_files_get_the_mode_of_a_plain_open(tmp_path: Path, umask: None, mask: int) -> None:
    os.umask(mask)
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})

    tables.write_csv(frame, tmp_path / "t.csv", ["a", "b"])
    files.write_text(tmp_path / "t.txt", "text\n")
    (tmp_path / "plain").write_text("plain\n")

    assert _mode(tmp_path / "t.csv") == 0o666 & ~mask == _mode(tmp_path / "plain")
    assert _mode(tmp_path / "t.txt") == 0o666 & ~mask
    assert files.current_umask() == mask
    assert (tmp_path / "t.csv").read_text() == "a,b\n1,x\n2,y\n"
    # Nothing but the two files is left behind (no temporary files).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain", "t.csv", "t.txt"]


def test_the_umask_is_read_without_proc_too(monkeypatch: pytest.MonkeyPatch, umask: None) -> None:
    os.umask(0o037)

    def no_proc(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("/proc/self/status")

    # The module's `open` is the builtin; shadowing it there hides /proc from current_umask.
    monkeypatch.setattr(files, "open", no_proc, raising=False)

    assert files.current_umask() == 0o037
    assert files.file_mode() == 0o640
    assert os.umask(0o037) == 0o037  # and it was put back
