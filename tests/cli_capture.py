"""The command line run in this process, its exit code and printed text captured: what the
CLI tests check (one line and exit 2 for bad input, the printed leaderboard)."""

from __future__ import annotations

import contextlib
import io
from typing import NamedTuple

from leakbench.cli import main


class Result(NamedTuple):
    code: int
    out: str
    err: str


def run_cli(*argv: str) -> Result:
    """``leakbench ARGV...`` in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Result(code, out.getvalue(), err.getvalue())
