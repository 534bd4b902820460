"""The text contract: a corpus of sentences, its two pools, a word vocabulary and fixed-length ids.

The image `Dataset` (`leakbench.datasets.base`) holds float images with a shape and classes; a
language model's data has neither, so a text corpus is a `TextCorpus`. Its loader is registered
in `DATASETS` (a named corpus, ``loader() -> TextCorpus``) or `FILE_SOURCES` (files, used as
``PREFIX:PATH``, ``loader(path) -> TextCorpus``) with ``modality="text"``; `load_text_corpus`
reads either, and `leakbench.datasets.loading.load_dataset` refuses them (docs/text.md).

The rules, each stated once here:

- **Tokens** (`tokenize`): the line is lower-cased; a token is a run of word characters with
  inner apostrophes (``know't``, ``we'll``), or any single other character that is not space
  (``,`` ``:`` ``?``). Nothing is dropped but white space.
- **Pools** (`split_pools`): the examples are permuted by ``numpy.random.default_rng(seed)``;
  the first ``round(public_share * N)`` of the permutation form the public pool (what the
  attacker may read: its vocabulary and prior), the rest the private pool (the clients' data).
  Both keep the corpus order inside them, and no example is in both.
- **Vocabulary** (`build_vocabulary`): from the public pool only. Ids 0..3 are reserved
  (`PAD`, `UNK`, `BOS`, `EOS`); then the ``max_words`` most frequent words, ties by the word's
  sort order. A private word outside it encodes as `UNK`.
- **Ids** (`Vocabulary.encode`): ``<bos>``, the words' ids, ``<eos>``; cut to
  ``sequence_length`` (a long line loses its tail and its ``<eos>``), then padded at the end
  with ``<pad>`` to exactly ``sequence_length``.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from leakbench.core.errors import ConfigError
from leakbench.datasets.base import DATASETS, FILE_SOURCES

PAD, UNK, BOS, EOS = 0, 1, 2, 3
RESERVED = ("<pad>", "<unk>", "<bos>", "<eos>")

_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def tokenize(line: str) -> list[str]:
    """The tokens of one line: lower-cased words (inner apostrophes kept) and single punctuation
    characters, in order (``"Is't a verdict?"`` -> ``["is't", "a", "verdict", "?"]``)."""
    return _TOKEN.findall(line.lower())


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """A text corpus split into two disjoint pools of examples (one sentence or line each).

    Attributes:
        name: The corpus name or its ``PREFIX:PATH`` source.
        private: The clients' examples, each a tuple of tokens.
        public: The attacker's examples (its vocabulary and prior), disjoint from ``private``.
    """

    name: str
    private: tuple[tuple[str, ...], ...]
    public: tuple[tuple[str, ...], ...]


def split_pools(
    name: str, examples: Sequence[Sequence[str]], *, public_share: float = 0.5, seed: int = 0
) -> TextCorpus:
    """Splits ``examples`` into the public and private pools by the seeded rule of the module.

    Raises:
        ConfigError: If ``public_share`` is not in (0, 1) or either pool would be empty.
    """
    if not 0.0 < float(public_share) < 1.0:
        raise ConfigError(f"dataset {name}: public_share must be in (0, 1), got {public_share}")
    count = len(examples)
    public_count = round(float(public_share) * count)
    if public_count < 1 or public_count >= count:
        raise ConfigError(
            f"dataset {name}: {count} example(s) cannot make a public and a private pool "
            f"(public_share {public_share})"
        )
    order = np.random.default_rng(int(seed)).permutation(count)
    public = np.sort(order[:public_count])
    private = np.sort(order[public_count:])
    rows = [tuple(example) for example in examples]
    return TextCorpus(name, tuple(rows[i] for i in private), tuple(rows[i] for i in public))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Word <-> id; ids 0..3 are `RESERVED`, the words follow from id 4."""

    words: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ids", {w: i for i, w in enumerate(self.words)})

    def __len__(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        """The id of ``word``, `UNK` if it is not in the vocabulary."""
        return int(self._ids.get(word, UNK))  # type: ignore[attr-defined]

    def encode(self, tokens: Iterable[str], sequence_length: int) -> np.ndarray:
        """One example as ``sequence_length`` int32 ids by the module's rule.

        Raises:
            ConfigError: If ``sequence_length`` is below 2 (room for ``<bos>`` and one more).
        """
        length = check_sequence_length(sequence_length)
        ids = [BOS, *(self.id(t) for t in tokens), EOS][:length]
        return np.array(ids + [PAD] * (length - len(ids)), dtype=np.int32)

    def encode_many(self, examples: Iterable[Iterable[str]], sequence_length: int) -> np.ndarray:
        """Examples as an int32 array [N, sequence_length] (`encode` of each)."""
        length = check_sequence_length(sequence_length)
        rows = [self.encode(example, length) for example in examples]
        return np.stack(rows) if rows else np.zeros((0, length), np.int32)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The words of ``ids``, ``<pad>`` left out."""
        return [self.words[int(i)] for i in ids if int(i) != PAD]


def check_sequence_length(sequence_length: object) -> int:
    """Returns ``sequence_length`` as an int, or raises `ConfigError` naming the field."""
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, (int, np.integer)):
        raise ConfigError(f"sequence_length must be an integer, got {sequence_length!r}")
    if sequence_length < 2:
        raise ConfigError(f"sequence_length must be >= 2, got {sequence_length}")
    return int(sequence_length)


def build_vocabulary(corpus: TextCorpus, max_words: int = 2000) -> Vocabulary:
    """The vocabulary of ``corpus``'s public pool: `RESERVED`, then at most ``max_words`` words,
    most frequent first (ties: the word's sort order).

    Raises:
        ConfigError: If ``max_words`` is below 1 or the public pool holds no word.
    """
    if isinstance(max_words, bool) or not isinstance(max_words, (int, np.integer)):
        raise ConfigError(f"max_words must be an integer, got {max_words!r}")
    if max_words < 1:
        raise ConfigError(f"max_words must be >= 1 (a vocabulary of zero words), got {max_words}")
    counts = Counter(token for example in corpus.public for token in example)
    for reserved in RESERVED:
        counts.pop(reserved, None)
    if not counts:
        raise ConfigError(
            f"dataset {corpus.name}: the public pool holds no word (a vocabulary of zero words)"
        )
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: int(max_words)]
    return Vocabulary(RESERVED + tuple(word for word, _ in ranked))


def read_text(path: Path, spec: str) -> str:
    """The UTF-8 text of ``path``.

    Raises:
        ConfigError: Naming ``spec`` if the file is empty, holds a NUL byte or is not UTF-8
            (both mark a binary file), or holds white space only.
    """
    data = path.read_bytes()
    if not data:
        raise ConfigError(f"dataset {spec}: the file is empty")
    if b"\x00" in data:
        raise ConfigError(
            f"dataset {spec}: a binary file (it holds NUL bytes), expected UTF-8 text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"dataset {spec}: not UTF-8 text (byte {err.start} cannot be decoded)"
        ) from None
    if not text.strip():
        raise ConfigError(f"dataset {spec}: the file holds no text (white space only)")
    return text


def load_text_corpus(name: str) -> TextCorpus:
    """A text corpus of `DATASETS` (``"tinyshakespeare"``) or a text file source of
    `FILE_SOURCES` (``"text:PATH"``); an image dataset raises `UnknownNameError`."""
    prefix, sep, path = name.partition(":")
    if sep:
        return FILE_SOURCES.get(prefix, modality="text")(path)
    return DATASETS.get(name, modality="text")()
