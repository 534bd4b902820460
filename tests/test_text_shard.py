"""A text run split with ``--shard I/N`` and joined by ``leakbench merge`` equals the whole
run, and a text run on two local worker processes equals one in this process."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from cli_capture import run_cli

CONFIG = """\
name = "text-shards"
dataset = "tinyshakespeare"
model = "gru"
suite = "listed"
images = 2
seeds = [0]

[[attack]]
name = "bag_of_words"

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = 0.01

[text]
sequence_length = 12
max_words = 200
batch_sizes = [1, 2]
test_sentences = 20
train_epochs = 1
train_batch_size = 64
"""


def _table(run: Path, name: str) -> pd.DataFrame:
    """A table less its timing columns (``seconds``, the leaderboard's ``seconds_mean``)."""
    frame = pd.read_csv(run / name)
    return frame.drop(columns=[c for c in frame.columns if c.startswith("seconds")])


def test_two_text_shards_merged_equal_the_whole_run(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    whole = run_cli("run", str(config), "--out", str(tmp_path / "whole"), "--quiet")
    assert whole.code == 0, whole.err
    shards = []
    for index in (1, 2):
        out = tmp_path / f"shard{index}"
        result = run_cli("run", str(config), "--out", str(out), "--shard", f"{index}/2", "--quiet")
        assert result.code == 0, result.err
        assert f"shard {index}/2;" in result.out
        shards.append(_table(out, "trials.csv"))
    # Whole groups (one private batch each: 2 + 1 batches), the first to shard 1, the two
    # others to shard 2 (contiguous slices of the plan).
    keys = ["batch_size", "batch_index"]
    first, second = (set(map(tuple, s[keys].to_numpy().tolist())) for s in shards)
    assert first == {(1, 0)} and second == {(1, 1), (2, 0)}

    # One shard alone is refused, naming the shard that holds what is missing.
    partial = run_cli("merge", str(tmp_path / "shard1"), "--out", str(tmp_path / "p"), "--quiet")
    assert partial.code == 2 and "from shard 2/2" in partial.err, partial.err

    merged = run_cli(
        "merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--out",
        str(tmp_path / "merged"), "--quiet",
    )  # fmt: skip
    assert merged.code == 0, merged.err
    assert "0 trials and 0 trainings missing" in merged.out, merged.out
    for name in ("trials.csv", "utility.csv", "leaderboard.csv"):
        pd.testing.assert_frame_equal(
            _table(tmp_path / "merged", name), _table(tmp_path / "whole", name)
        )
    assert len(_table(tmp_path / "whole", "utility.csv")) == 2  # one training per defense
    assert (tmp_path / "merged" / "report.html").is_file()


def test_a_text_run_on_two_worker_processes_equals_the_run_in_this_process(
    tmp_path: Path,
) -> None:
    # One pipeline for every modality: a text run takes the image runs' backends.
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    runs = {}
    for name, flags in (("one", []), ("two", ["--workers", "2"])):
        result = run_cli("run", str(config), "--out", str(tmp_path / name), "--quiet", *flags)
        assert result.code == 0, result.err
        runs[name] = tmp_path / name
    for name in ("trials.csv", "utility.csv", "leaderboard.csv"):
        pd.testing.assert_frame_equal(_table(runs["two"], name), _table(runs["one"], name))
