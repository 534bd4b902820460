"""A text run through the command line: one-line errors, a tiny end-to-end run, resume, and the
bag-of-words attack as the run reads it (untied, tied, frozen embeddings)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import tensorflow as tf
from cli_capture import run_cli

from leakbench.attacks.text.bag_of_words import BagOfWords
from leakbench.attacks.text.base import TextTarget
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus
from leakbench.modalities.text import text_gradients
from leakbench.outputs.tables import TEXT_LEADERBOARD_COLUMNS, TEXT_TRIAL_COLUMNS
from leakbench.run import text as text_runner
from leakbench.run.config import build_run, parse_config
from leakbench.run.text import text_model, words_of

TINY = """\
name = "tiny-text"
dataset = "{dataset}"
model = "{model}"
suite = "listed"
images = 2

[[attack]]
name = "{attack}"

[[defense]]
name = "none"

[[defense]]
name = "prune"
ratio = 0.9

[text]
sequence_length = {length}
max_words = {words}
batch_sizes = [1, 2]
test_sentences = 20
train_epochs = 0
{extra}
"""


def _config(**changes: str) -> str:
    values = {"dataset": "tinyshakespeare", "model": "gru", "attack": "bag_of_words", "extra": ""}
    values.update(length="24", words="300")
    return TINY.format(**{**values, **changes})


BAD = [
    ("empty-file", _config(dataset="text:{tmp}/empty.txt"), "the file is empty"),
    ("binary-file", _config(dataset="text:{tmp}/binary.bin"), "a binary file"),
    ("zero-words", _config(words="0"), "text.max_words must be an integer in [1,"),
    (
        "sequence-beyond-model",
        _config(length="1000"),
        "text.sequence_length must be an integer in [2, 512]",
    ),
    ("image-attack", _config(attack="dlg"), "attack 'dlg' is an image attack"),
    ("image-model", _config(model="lenet"), "model lenet is an image model"),
    (
        "text-attack-on-images",
        _config(dataset="digits", model="lenet"),
        "attack 'bag_of_words' is a text attack",
    ),
    (
        "text-model-on-images",
        _config(dataset="digits", model="transformer", attack="idlg"),
        "model transformer is a text model",
    ),
    (
        "text-table-on-images",
        _config(dataset="digits", model="lenet", attack="idlg"),
        "the [text] table is for a text corpus",
    ),
    (
        "image-only-defense",
        _config().replace('name = "prune"\nratio = 0.9', 'name = "mixup"'),
        "mixup",
    ),
    (
        "threat-model",
        _config() + "[threat_model]\nlabels_known = true\n",
        "threat_model.labels_known",
    ),
    ("too-few-images", _config().replace("[1, 2]", "[1, 4]"), "images must be at least"),
]


@pytest.mark.parametrize(("text", "needle"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_text_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, text: str, needle: str
) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "binary.bin").write_bytes(b"some\x00bytes\n" * 10)
    config = tmp_path / "config.toml"
    config.write_text(text.replace("{tmp}", str(tmp_path)), encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 2, result
    assert len(result.err.splitlines()) == 1 and result.err.startswith("leakbench: error: ")
    assert needle in result.err, result.err
    assert result.out == ""
    assert sorted(tmp_path.rglob("*")) == before


def _frame(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns=["seconds"])


def test_a_tiny_text_run_writes_its_tables_and_resumes(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "text.toml"
    config.write_text(_config(), encoding="utf-8")
    whole = run_cli("run", str(config), "--out", str(tmp_path / "whole"), "--quiet")
    assert whole.code == 0, whole.err
    for name in ("trials.csv", "leaderboard.csv", "utility.csv", "report.html", "config.toml"):
        assert (tmp_path / "whole" / name).is_file()
    trials = pd.read_csv(tmp_path / "whole" / "trials.csv")
    assert list(trials.columns) == TEXT_TRIAL_COLUMNS
    # Rows are sentences: 2 per batch size, x 2 defenses x 1 attack (6 trials).
    assert len(trials) == 2 * 2 * 2
    board = pd.read_csv(tmp_path / "whole" / "leaderboard.csv")
    assert list(board.columns) == TEXT_LEADERBOARD_COLUMNS
    assert set(board["batch_size"]) == {1, 2}
    assert set(board.loc[board["defense"] == "none", "verdict"]) == {"baseline"}
    none = trials[trials["defense"] == "none"]
    assert (none["bag_precision"] == 1.0).all()  # untied embeddings: every word found is one
    assert (none["stop_reason"] == "exact").all()
    page = (tmp_path / "whole" / "report.html").read_text(encoding="utf-8")
    assert "Leaderboard" in page and "prune ratio=0.9" in page
    # The config's hash is recorded as an image run's is, so the board's tamper check applies.
    recorded = json.loads((tmp_path / "whole" / "environment.json").read_text(encoding="utf-8"))
    held = (tmp_path / "whole" / "config.toml").read_text(encoding="utf-8")
    assert recorded["config_sha256"] == hashlib.sha256(held.encode("utf-8")).hexdigest()
    again = run_cli("report", str(tmp_path / "whole"), "--out", str(tmp_path / "again.html"))
    assert again.code == 0 and (tmp_path / "again.html").read_text(encoding="utf-8") == page

    # Interrupted after its first group, the run keeps that group and resumes the rest.
    real = text_runner.run_text_group
    calls = []

    def interrupted(context, group):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(context, group)

    monkeypatch.setattr(text_runner, "run_text_group", interrupted)
    assert run_cli("run", str(config), "--out", str(tmp_path / "cut"), "--quiet").code == 130
    assert not (tmp_path / "cut" / "trials.csv").exists()
    monkeypatch.setattr(text_runner, "run_text_group", real)
    resumed = run_cli("run", str(config), "--out", str(tmp_path / "cut"), "--quiet")
    assert resumed.code == 0 and "4 trials run, 2 reused" in resumed.out, resumed.out
    pd.testing.assert_frame_equal(
        _frame(tmp_path / "cut" / "trials.csv"), _frame(tmp_path / "whole" / "trials.csv")
    )


@pytest.mark.parametrize(
    ("tie", "freeze"),
    [(False, False), (True, False), (False, True)],
    ids=["untied", "tied", "frozen"],
)
def test_bag_of_words_reads_the_embedding_or_the_output_bias(tie: bool, freeze: bool) -> None:
    extra = f"tie_embeddings = {str(tie).lower()}\nfreeze_embeddings = {str(freeze).lower()}"
    spec = parse_config(_config(model="transformer", extra=extra))
    corpus = load_text_corpus("tinyshakespeare")
    vocab = build_vocabulary(corpus, 300)
    ids = vocab.encode_many(corpus.private[:4], 24)
    model = text_model(spec.model, spec.text, len(vocab), 0)
    _, grads = text_gradients(model, ids)
    target = TextTarget(model, tuple(grads), 4, 24, len(vocab), ids[:0])
    found, _ = BagOfWords().bag(target)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    if tie or freeze:  # the output bias: every target word, and nothing else
        assert set(found.tolist()) == words_of(targets)
    else:  # the embedding: every input word the loss reads
        assert set(found.tolist()) == words_of(inputs[targets != 0])
    result = BagOfWords().run(target, tf.constant([0, 0], tf.int64))
    assert result.ids.shape == (4, 24) and result.stop_reason == "exact"
    assert words_of(result.ids) == set(found.tolist())  # every word dealt, none invented
    assert (result.ids[:, 0] == 2).all()  # each row opens with <bos>


def test_an_image_config_resolves_without_a_text_table() -> None:
    spec = build_run({"attack": [{"name": "idlg"}]})
    assert spec.text is None and "[text]" not in spec.to_toml()
    text = parse_config(_config())
    assert text.training is None and "[text]" in text.to_toml()
    assert parse_config(text.to_toml()) == text


def test_the_standard_text_suite_adds_the_families_and_adaptive_settings() -> None:
    spec = parse_config(
        _config().replace('suite = "listed"\n', "")
        + '\n[[defense]]\nname = "dpsgd"\nnoise_multiplier = 1.0\nnorm = 1.0\n'
    )
    by_name = {d.name: d for d in spec.defense_grid()}

    def names(defense: str) -> list[str]:
        return [
            " ".join([a.name, *(f"{k}={v}" for k, v in sorted(a.params().items()))])
            for a in spec.text_attacks_for(by_name[defense])
        ]

    families = {"bag_of_words", "span", "tag"}
    for defense in by_name:
        assert families <= {n.split()[0] for n in names(defense)}
    assert any("span" in n and "test=rank" in n for n in names("prune"))
    assert not any("tag" in n and "loss=cosine" in n for n in names("prune"))
    assert any("tag" in n and "loss=cosine" in n for n in names("dpsgd"))
    # none meets every defense's adaptive attacks, so each can vouch for itself there.
    assert set(names("prune")) | set(names("dpsgd")) <= set(names("none"))
    listed = parse_config(_config())
    assert [a.name for a in listed.text_attacks_for(listed.defense_grid()[1])] == ["bag_of_words"]
