"""The text corpus: the shipped slice, the line and token rules, pools, vocabulary, ids, bad
files."""

from __future__ import annotations

import hashlib
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from leakbench.core.errors import ConfigError, DataError, UnknownNameError
from leakbench.core.plugins import adopt_function
from leakbench.datasets import DATASETS, FILE_SOURCES, load_dataset, modality_of
from leakbench.datasets.text_base import (
    BOS,
    EOS,
    PAD,
    RESERVED,
    UNK,
    TextCorpus,
    Vocabulary,
    build_vocabulary,
    load_text_corpus,
    split_pools,
    tokenize,
)
from leakbench.datasets.tinyshakespeare import play_lines

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SLICE_SHA256 = "2f0bdb3a032ff3ebddcd77829d7c87f13856ab39819a75e31dbcddbc0ab2d9f1"


def test_the_shipped_slice_is_the_file_the_notice_describes() -> None:
    data = resources.files("leakbench.datasets").joinpath("text_data/tinyshakespeare.txt")
    raw = data.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SLICE_SHA256
    assert len(raw) < 300_000
    notice = (ROOT / "datasets" / "text_data" / "NOTICE").read_text("utf-8")
    assert SLICE_SHA256 in notice and "MIT License" in notice and "public domain" in notice
    full = Path("/work/shared/data/text/tinyshakespeare.txt")
    if full.exists():  # the slice is the full file's opening lines, unchanged
        assert full.read_bytes().startswith(raw)


def test_package_data_declares_the_corpus_and_its_notice() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert "leakbench.datasets.text_data" in doc["tool"]["setuptools"]["packages"]
    shipped = doc["tool"]["setuptools"]["package-data"]["leakbench.datasets.text_data"]
    for name in shipped:
        assert (ROOT / "datasets" / "text_data" / name).is_file(), name
    assert set(shipped) == {"tinyshakespeare.txt", "NOTICE"}


def test_text_corpora_are_text_entries_of_the_one_registries() -> None:
    assert DATASETS.names("text") == ["tinyshakespeare"]
    assert FILE_SOURCES.names("text") == ["text"]
    assert {"digits", "lfw", "mnist", "fashion_mnist", "cifar10", "cifar100"} <= set(
        DATASETS.names("image")
    )
    assert {"npz", "idx", "folder"} <= set(FILE_SOURCES.names("image"))
    with pytest.raises(UnknownNameError, match="dataset 'digits' is an image dataset, not a text"):
        load_text_corpus("digits")
    with pytest.raises(UnknownNameError, match="file source 'npz' is an image file source"):
        load_text_corpus("npz:/nowhere.npz")
    with pytest.raises(UnknownNameError, match="'tinyshakespeare' is a text dataset, not an image"):
        load_dataset("tinyshakespeare")
    with pytest.raises(UnknownNameError, match="file source 'text' is a text file source"):
        load_dataset("text:/nowhere.txt")


@pytest.mark.parametrize(
    ("spec", "modality"),
    [
        *((name, "image") for name in ("digits", "lfw", "mnist", "cifar10", "cifar100")),
        ("fashion_mnist", "image"),
        ("npz:/x.npz", "image"),
        ("idx:/x", "image"),
        ("folder:/x", "image"),
        ("tinyshakespeare", "text"),
        ("text:/x.txt", "text"),
        ("text:C:/a:b.txt", "text"),  # only the first colon splits
    ],
)
def test_modality_of_a_dataset_string(spec: str, modality: str) -> None:
    assert modality_of(spec) == modality


@pytest.mark.parametrize(
    ("spec", "message"),
    [("nope", "unknown dataset 'nope'; allowed: "), ("zip:/x", "unknown file source 'zip'")],
)
def test_modality_of_an_unknown_dataset_is_refused(spec: str, message: str) -> None:
    with pytest.raises(UnknownNameError, match=message) as caught:
        modality_of(spec)
    assert "\n" not in str(caught.value)


def test_a_plugin_dataset_is_an_image_one_unless_it_says_text() -> None:
    # An entry point's loader is adopted as the plugin loader adopts it; a decorator may say text.
    assert adopt_function(DATASETS, "test_plain_plugin", lambda: None)
    DATASETS.register("test_text_plugin", modality="text")(lambda: None)
    try:
        assert modality_of("test_plain_plugin") == "image"
        assert modality_of("test_text_plugin") == "text"
        assert "test_text_plugin" in DATASETS.names("text")
    finally:
        DATASETS.unregister("test_plain_plugin")
        DATASETS.unregister("test_text_plugin")
    assert "test_text_plugin" not in DATASETS.names("text")


def test_speaker_names_open_a_block_and_are_dropped() -> None:
    text = "First Citizen:\nBefore we proceed:\nhear me.\n\nAll:\nSpeak, speak.\n\n"
    # The second line ends in ':' but is spoken (not the block's first line): kept.
    assert play_lines(text) == ["Before we proceed:", "hear me.", "Speak, speak."]


def test_tokens_are_lower_case_words_and_single_punctuation() -> None:
    assert tokenize("Is't a verdict?") == ["is't", "a", "verdict", "?"]
    assert tokenize("We know't, we KNOW't.") == ["we", "know't", ",", "we", "know't", "."]
    assert tokenize("away -- 'tis") == ["away", "-", "-", "'", "tis"]
    assert tokenize("   ") == []


def test_the_embedded_corpus_has_disjoint_seeded_pools() -> None:
    corpus = load_text_corpus("tinyshakespeare")
    assert len(corpus.private) == len(corpus.public) == 1893
    assert corpus.private[0] == tuple(tokenize("Before we proceed any further, hear me speak."))
    # No speaker line survives: the first play's speakers are not examples.
    assert ("first", "citizen", ":") not in set(corpus.private) | set(corpus.public)
    text = resources.files("leakbench.datasets").joinpath("text_data/tinyshakespeare.txt")
    lines = play_lines(text.read_text("utf-8"))
    assert len(lines) == len(corpus.private) + len(corpus.public)
    assert corpus == split_pools("tinyshakespeare", [tokenize(line) for line in lines], seed=0)


def test_pools_split_by_a_seeded_permutation() -> None:
    rows = [(f"w{i}",) for i in range(10)]
    a = split_pools("toy", rows, public_share=0.3, seed=1)
    order = np.random.default_rng(1).permutation(10)
    assert a.public == tuple(rows[i] for i in sorted(order[:3]))
    assert a.private == tuple(rows[i] for i in sorted(order[3:]))
    assert set(a.public).isdisjoint(a.private)
    assert split_pools("toy", rows, public_share=0.3, seed=2).public != a.public
    with pytest.raises(ConfigError, match="public_share"):
        split_pools("toy", rows, public_share=1.0)
    with pytest.raises(ConfigError, match="cannot make a public and a private pool"):
        split_pools("toy", rows[:1])


def test_vocabulary_comes_from_the_public_pool_only() -> None:
    corpus = TextCorpus("toy", private=(("secret", "b"),), public=(("b", "a", "b"), ("c",)))
    vocab = build_vocabulary(corpus)
    assert vocab.words == RESERVED + ("b", "a", "c")  # by count, then by sort order
    assert vocab.id("secret") == UNK
    assert build_vocabulary(corpus, max_words=1).words == RESERVED + ("b",)
    with pytest.raises(ConfigError, match="max_words must be >= 1"):
        build_vocabulary(corpus, max_words=0)
    empty = TextCorpus("empty", private=(("a",),), public=((),))
    with pytest.raises(ConfigError, match="holds no word"):
        build_vocabulary(empty)


def test_encoding_pads_and_truncates_to_the_sequence_length() -> None:
    vocab = Vocabulary(RESERVED + ("a", "b"))
    assert vocab.encode(["a", "b"], 6).tolist() == [BOS, 4, 5, EOS, PAD, PAD]
    assert vocab.encode(["a", "b", "a"], 3).tolist() == [BOS, 4, 5]  # the tail and <eos> cut
    assert vocab.encode_many([["b"], ["zz"]], 4).tolist() == [
        [BOS, 5, EOS, PAD],
        [BOS, UNK, EOS, PAD],
    ]
    assert vocab.decode([BOS, 4, EOS, PAD]) == ["<bos>", "a", "<eos>"]
    for bad in (1, 0, -3):
        with pytest.raises(ConfigError, match="sequence_length must be >= 2"):
            vocab.encode(["a"], bad)
    with pytest.raises(ConfigError, match="sequence_length must be an integer"):
        vocab.encode_many([["a"]], 4.0)  # type: ignore[arg-type]


def test_a_text_file_is_one_example_per_non_empty_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("Hello, world!\n\n  Speaker:  \nsecond line\nthird\nfourth\n", "utf-8")
    corpus = load_text_corpus(f"text:{path}")
    everything = sorted(corpus.private + corpus.public)
    assert everything == sorted(
        [
            ("hello", ",", "world", "!"),
            ("speaker", ":"),
            ("second", "line"),
            ("third",),
            ("fourth",),
        ]
    )
    assert len(corpus.public) == 2  # round(0.5 * 5)
    assert corpus.name == f"text:{path}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty"),
        (b"  \n\n\t\n", "white space only"),
        (b"text\x00more\n", "binary file"),
        (b"caf\xe9\nline\n", "not UTF-8 text"),
        (b"just one line\n", "cannot make a public and a private pool"),
    ],
)
def test_a_bad_text_file_is_one_config_error_naming_the_source(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as info:
        load_text_corpus(f"text:{path}")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"dataset text:{path}")


def test_a_missing_text_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_text_corpus(f"text:{tmp_path / 'absent.txt'}")
