"""Text file source ``text:PATH``: a user's UTF-8 corpus, one example per non-empty line."""

from __future__ import annotations

from leakbench.datasets._util import existing_path
from leakbench.datasets.base import FILE_SOURCES
from leakbench.datasets.text_base import TextCorpus, read_text, split_pools, tokenize


@FILE_SOURCES.register("text", modality="text")
def load_text_file(path: str) -> TextCorpus:
    """Reads a UTF-8 text file: every line that is not empty after stripping white space is one
    example, tokenized by `tokenize` and split into pools by `split_pools` (half public, seed
    0). No speaker names are dropped (that rule is Tiny Shakespeare's own).

    Raises:
        DataError: If the path is missing or a directory.
        ConfigError: If the file is empty, binary (a NUL byte, or not UTF-8), white space only,
            or holds fewer than two lines (one for each pool).
    """
    spec = f"text:{path}"
    text = read_text(existing_path(path, spec, directory=False), spec)
    lines = [line.strip() for line in text.splitlines()]
    return split_pools(spec, [tokenize(line) for line in lines if line])
