"""The code blocks of README.md and the documentation pages that are marked runnable run.

A fenced Python block directly after a ``<!-- runnable -->`` line is executed; the runnable
blocks of one page run in order in one fresh interpreter (a later block may use what an earlier
one defined), in a temporary working directory, offline.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- runnable -->"
# The marker on a line of its own (the prose may name it in backticks).
MARK_LINE = re.compile(r"^<!-- runnable -->$", re.M)
BLOCK = re.compile(r"^<!-- runnable -->\n```python\n(.*?)\n```", re.S | re.M)


def runnable_blocks(text: str) -> list[str]:
    """The page's runnable blocks; a marker not followed by a Python block is an error."""
    blocks = BLOCK.findall(text)
    if len(MARK_LINE.findall(text)) != len(blocks):
        raise ValueError(f"{MARK} must be followed directly by a ```python block")
    return blocks


WITH_BLOCKS = [page for page in PAGES if MARK_LINE.search(page.read_text(encoding="utf-8"))]


def test_the_pages_have_runnable_blocks() -> None:
    # The contributing recipes are runnable; a page losing its markers would test nothing.
    assert ROOT / "docs" / "CONTRIBUTING.md" in WITH_BLOCKS


def test_a_marker_without_a_python_block_is_refused() -> None:
    with pytest.raises(ValueError, match="must be followed"):
        runnable_blocks(f"{MARK}\n```bash\nls\n```\n")


@pytest.mark.parametrize("page", WITH_BLOCKS, ids=lambda page: page.name)
def test_the_runnable_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    code = "\n\n".join(runnable_blocks(page.read_text(encoding="utf-8")))
    env = dict(os.environ, PYTHONSAFEPATH="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{page.name}:\n{proc.stderr[-3000:]}"
