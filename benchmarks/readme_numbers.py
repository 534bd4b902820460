"""Rewrites the README's excerpt of the default run's printed leaderboard from the committed
`results/default/leaderboard.csv` (`leakbench.cli.headline_table`), so the README shows what the
committed run prints. `tests/test_readme.py` fails when the two disagree.

    PYTHONSAFEPATH=1 python benchmarks/readme_numbers.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from leakbench.cli import headline_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The fenced block right after the sentence that introduces it.
BLOCK = re.compile(r"(What it prints \(`leakbench\.cli\.headline_table`.*?```\n)(.*?)(```)", re.S)


def default_excerpt() -> str:
    """The printed leaderboard of the committed default run."""
    return headline_table(pd.read_csv(ROOT / "results" / "default" / "leaderboard.csv")) + "\n"


def readme_excerpt(text: str) -> str:
    """The excerpt as the README holds it."""
    match = BLOCK.search(text)
    if match is None:
        raise ValueError("README.md: the printed-leaderboard excerpt is missing")
    return match.group(2)


def main() -> None:
    text = README.read_text(encoding="utf-8")
    readme_excerpt(text)  # refuses a README without the block
    updated = BLOCK.sub(lambda m: m.group(1) + default_excerpt() + m.group(3), text, count=1)
    README.write_text(updated, encoding="utf-8")
    print("README.md: " + ("unchanged" if updated == text else "excerpt rewritten"))


if __name__ == "__main__":
    main()
