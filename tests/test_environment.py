"""`describe_cpu`: the processor and its kernel-deciding extensions in environment.json."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from leakbench.core import environment
from leakbench.core.environment import (
    NOT_RECORDED,
    describe_commit,
    describe_cpu,
    describe_environment,
)

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile amx_bf16
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2
"""


def test_the_first_processor_s_model_and_kernel_flags_are_read() -> None:
    # The first processor's lines decide; only the listed extensions are kept, in their order.
    assert describe_cpu(CPUINFO) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_flags": ["avx2", "avx512f", "amx_tile"],
    }


def test_no_model_line_gives_none_and_no_flags() -> None:
    assert describe_cpu("processor\t: 0\n") == {"cpu": None, "cpu_flags": []}


def test_environment_json_carries_the_processor() -> None:
    environment = describe_environment()
    assert "cpu" in environment and "cpu_flags" in environment


def _git(folder: Path, *arguments: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_a_git_checkout_records_its_commit_and_whether_it_is_dirty(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "code.py").write_text("x = 1\n", encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert describe_commit(package) == {"commit": head, "dirty": False}
    (package / "code.py").write_text("x = 2\n", encoding="utf-8")  # an edit makes it dirty
    assert describe_commit(package) == {"commit": head, "dirty": True}
    (package / "code.py").write_text("x = 1\n", encoding="utf-8")
    # What runs and the board write is not the code: a run regenerated in place stays clean.
    for output in ("results/run/trials.csv", "docs/board/board.csv"):
        (repo / output).parent.mkdir(parents=True)
        (repo / output).write_text("new\n", encoding="utf-8")
    assert describe_commit(package) == {"commit": head, "dirty": False}
    (repo / "new.txt").write_text("untracked\n", encoding="utf-8")  # a new file elsewhere is
    assert describe_commit(package) == {"commit": head, "dirty": True}


@needs_git
def test_a_folder_outside_any_checkout_records_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # git looks no higher than tmp_path, whatever holds it.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    folder = tmp_path / "plain"
    folder.mkdir()
    assert describe_commit(folder) == {"commit": NOT_RECORDED}


def test_without_git_the_commit_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    assert describe_commit(tmp_path) == {"commit": NOT_RECORDED}
    assert describe_environment()["commit"] == NOT_RECORDED


def test_a_run_s_environment_names_the_commit_of_this_package() -> None:
    expected = describe_commit(Path(environment.__file__).resolve().parent)
    assert describe_environment()["commit"] == expected["commit"]
