"""The embedded text corpus ``tinyshakespeare``: the first 6,003 lines of Tiny Shakespeare.

The slice (``text_data/tinyshakespeare.txt``, 156 KB; where it comes from and its licence:
``text_data/NOTICE``) is Coriolanus and the opening of Richard III, read without network.
"""

from __future__ import annotations

import functools
from importlib import resources

from leakbench.datasets.base import DATASETS
from leakbench.datasets.text_base import TextCorpus, split_pools, tokenize

FILE = "tinyshakespeare.txt"


def play_lines(text: str) -> list[str]:
    """The spoken lines of a play in Tiny Shakespeare's layout, each stripped.

    The file is blocks separated by empty lines; a block opens with its speaker's name alone
    on a line ending in ``:`` (``First Citizen:``). The rule: every non-empty line is one
    example, except the first line of a block when it ends in ``:``. A spoken line that ends
    in ``:`` inside a block (1,540 of them in the whole file) is kept.
    """
    lines: list[str] = []
    opens_block = True
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            opens_block = True
            continue
        if not (opens_block and line.endswith(":")):
            lines.append(line)
        opens_block = False
    return lines


@DATASETS.register("tinyshakespeare", modality="text")
@functools.lru_cache(maxsize=1)
def load_tinyshakespeare() -> TextCorpus:
    """The shipped slice of Tiny Shakespeare, one example per spoken line (`play_lines`),
    tokenized by `tokenize`, split into pools by `split_pools` (half public, seed 0)."""
    text = resources.files("leakbench.datasets").joinpath(f"text_data/{FILE}").read_text("utf-8")
    return split_pools("tinyshakespeare", [tokenize(line) for line in play_lines(text)])
