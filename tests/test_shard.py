"""Sharding for job arrays (`run --shard I/N`) and `leakbench merge`.

Every run here is in-process (`main`), with the attack parameters and ``parallel_trials`` of
the resume test, so the XLA program of the attack compiles once per test process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import sqlite3
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
from configs import run_config

from leakbench.cli import main
from leakbench.core.errors import ConfigError
from leakbench.datasets import load_dataset
from leakbench.outputs.tables import TIMING_COLUMNS
from leakbench.run.config import parse_config
from leakbench.run.plan import attack_groups, plan, plan_training
from leakbench.run.shard import SHARD_FILE, Shard

SEEDS = (0, 1)
IMAGES = 2
CELLS = 3  # idlg x (none, gaussian 1e-3, gaussian 1e-1)
TRIALS = CELLS * IMAGES * len(SEEDS)
WIDTH = 2  # parallel_trials: three groups per seed, six in all


def _config(*, seeds=SEEDS, images=IMAGES, sigma: object = (1e-3, 1e-1), training=None) -> str:
    """The sharded run's config, or a variant of it."""
    sigma = list(sigma) if isinstance(sigma, tuple) else sigma
    return run_config(
        "sharded",
        images=images,
        seeds=seeds,
        parallel_trials=WIDTH,
        defenses=({"name": "none"}, {"name": "gaussian", "sigma": sigma}),
        training=training,
    )


CONFIG = _config()
TABLES = ("trials.csv", "leaderboard.csv", "utility.csv")


class Result(NamedTuple):
    code: int
    out: str
    err: str


def _main(*argv: str | Path) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Result(code, out.getvalue(), err.getvalue())


def _ok(result: Result) -> str:
    """The summary line of a run that succeeded."""
    assert result.code == 0, result.err
    return result.out.strip().splitlines()[-1]


def _refused(result: Result, *needles: str) -> None:
    assert result.code == 2, result.out + result.err
    assert len(result.err.splitlines()) == 1, result.err
    assert result.err.startswith("leakbench: error: ")
    assert "Traceback" not in result.err and result.out == ""
    for needle in needles:
        assert needle in result.err, (needle, result.err)


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def _assert_same_tables(a: Path, b: Path) -> None:
    for table in TABLES:
        frames = [_without_timing(pd.read_csv(d / table)) for d in (a, b)]
        pd.testing.assert_frame_equal(*frames, obj=table)


def _store(path: Path) -> dict[str, dict[str, str]]:
    """Every entry of a run directory's store, by table and key."""
    uri = f"{(path / 'store.sqlite').absolute().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return {t: dict(db.execute(f"SELECT key, rows FROM {t}")) for t in ("trials", "utility")}


def _snapshot(path: Path) -> dict[str, bytes]:
    """The files of a run directory, without SQLite's -wal and -shm files (a reader, like
    merge, may create or touch them)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(path.iterdir())
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


@dataclasses.dataclass(frozen=True)
class Runs:
    config: Path
    full: Path
    shards: list[Path]
    merged: Path
    merge: Result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The config run whole, as shards 1/2 and 2/2, and the two shards merged."""
    root = tmp_path_factory.mktemp("shards")
    config = root / "sharded.toml"
    config.write_text(CONFIG, encoding="utf-8")
    full = root / "full"
    assert _ok(_main("run", config, "--out", full, "--quiet")).startswith(f"{TRIALS} trials run")
    shards = [root / f"shard{i}" for i in (1, 2)]
    for i, out in enumerate(shards, 1):
        summary = _ok(_main("run", config, "--out", out, "--shard", f"{i}/2", "--quiet"))
        assert f"shard {i}/2" in summary
    merged = root / "merged"
    return Runs(config, full, shards, merged, _main("merge", *shards, "--out", merged))


def _groups() -> list[list[str]]:
    """The keys of the config's attack groups, in plan order."""
    trials = plan(parse_config(CONFIG), load_dataset("digits"))
    return [[t.key for t in group] for group in attack_groups(trials, WIDTH)]


# --- the share of a shard -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shard"), [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)), (" 4 / 4 ", Shard(4, 4))]
)
def test_shard_syntax(text: str, shard: Shard) -> None:
    assert Shard.parse(text) == shard
    assert str(shard) == f"{shard.index}/{shard.count}"


@pytest.mark.parametrize("text", ["3/2", "0/0", "0/2", "1/0", "a/b", "-1/2", "1/2/3", "2", ""])
def test_bad_shards_name_the_option_and_the_allowed_form(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--shard must be I/N with integers 1 <= I <= N"):
        Shard.parse(text)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("total", [0, 1, 6, 7, 23])
def test_shards_cut_items_into_contiguous_near_equal_slices(total: int, count: int) -> None:
    slices = [Shard(i, count).take(list(range(total))) for i in range(1, count + 1)]
    assert [x for part in slices for x in part] == list(range(total))
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    owners = Shard(1, count).owners(total)
    assert owners == [i for i, part in enumerate(slices, 1) for _ in part]


# --- run --shard and merge ------------------------------------------------------------------


def test_each_shard_runs_whole_attack_groups_and_exports_what_it_holds(runs: Runs) -> None:
    groups = _groups()
    assert len(groups) == 3 * len(SEEDS) and len({len(g) for g in groups}) == 1
    reference = pd.read_csv(runs.full / "trials.csv")
    held: list[str] = []
    for i, out in enumerate(runs.shards, 1):
        assert json.loads((out / SHARD_FILE).read_text()) == {"count": 2, "index": i}
        assert (out / "config.toml").read_bytes() == (runs.full / "config.toml").read_bytes()
        # Contiguous slices of the groups of the whole plan: shard 1 has groups 0-2.
        expected = [key for group in groups[3 * (i - 1) : 3 * i] for key in group]
        keys = _store(out)["trials"]
        assert sorted(keys) == sorted(expected)
        held += keys
        # The shard's tables are its store's rows, in plan order.
        trials = pd.read_csv(out / "trials.csv")
        assert len(trials) == len(expected)
        assert set(trials["seed"]) == {SEEDS[i - 1]}
        mine = reference[reference["seed"] == SEEDS[i - 1]].reset_index(drop=True)
        pd.testing.assert_frame_equal(_without_timing(trials), _without_timing(mine))
        assert len(pd.read_csv(out / "leaderboard.csv")) == CELLS
    assert sorted(held) == sorted(_store(runs.full)["trials"])


def test_two_merged_shards_give_the_unsharded_tables(runs: Runs) -> None:
    summary = _ok(runs.merge)
    assert summary.startswith(f"merged shard 1/2, 2/2: {TRIALS} trials and 0 trainings added;")
    assert "0 trials and 0 trainings missing" in summary
    assert "leaked" in runs.merge.out.splitlines()[0].split()  # the leaderboard, as `run` prints it
    _assert_same_tables(runs.full, runs.merged)
    assert (runs.merged / "config.toml").read_bytes() == (runs.full / "config.toml").read_bytes()
    assert not (runs.merged / SHARD_FILE).exists()
    # The stored entries are the shards' own, timings included.
    merged = _store(runs.merged)
    shards = [_store(s) for s in runs.shards]
    assert merged["trials"] == {**shards[0]["trials"], **shards[1]["trials"]}
    assert merged["utility"] == {}
    # The figures' arrays come through the merge too: the same cell files, the same contents.
    names = sorted(p.name for p in (runs.full / "arrays").iterdir())
    assert names and names == sorted(p.name for p in (runs.merged / "arrays").iterdir())
    for name in names:
        with np.load(runs.full / "arrays" / name) as a, np.load(runs.merged / "arrays" / name) as b:
            assert a.files == b.files
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])


def test_merging_twice_changes_nothing(runs: Runs, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    shutil.copytree(runs.merged, out)
    before, stored = _snapshot(out), _store(out)

    again = _main("merge", *runs.shards, "--out", out, "--quiet")

    assert _ok(again).startswith("merged shard 1/2, 2/2: 0 trials and 0 trainings added;")
    assert _store(out) == stored
    assert {k: v for k, v in _snapshot(out).items() if k in before} == before


def test_a_merged_run_is_a_finished_unsharded_run(runs: Runs, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    shutil.copytree(runs.merged, out)

    summary = _ok(_main("run", runs.config, "--out", out, "--quiet"))

    assert summary.startswith(f"0 trials run, {TRIALS} reused")
    _assert_same_tables(runs.full, out)


def test_three_shards_cut_inside_a_seed_and_merge_to_the_same_tables(
    runs: Runs, tmp_path: Path
) -> None:
    dirs = [tmp_path / f"shard{i}" for i in (1, 2, 3)]
    for i, out in enumerate(dirs, 1):
        _ok(_main("run", runs.config, "--out", out, "--shard", f"{i}/3", "--quiet"))
    # Six groups in three slices of two: shard 2 holds the last group of seed 0 and the first
    # of seed 1.
    assert sorted(set(pd.read_csv(dirs[1] / "trials.csv")["seed"])) == [0, 1]

    _ok(_main("merge", *reversed(dirs), "--out", tmp_path / "merged", "--quiet"))

    _assert_same_tables(runs.full, tmp_path / "merged")


def test_more_shards_than_groups_leave_some_shards_empty(runs: Runs, tmp_path: Path) -> None:
    count = len(_groups()) + 2
    dirs = [tmp_path / f"shard{i}" for i in range(1, count + 1)]
    for i, out in enumerate(dirs, 1):
        _ok(_main("run", runs.config, "--out", out, "--shard", f"{i}/{count}", "--quiet"))
    sizes = [len(pd.read_csv(d / "trials.csv")) for d in dirs]
    assert sizes.count(0) == 2 and sum(sizes) == TRIALS

    _ok(_main("merge", *dirs, "--out", tmp_path / "merged", "--quiet"))

    _assert_same_tables(runs.full, tmp_path / "merged")


def test_a_shard_resumes_and_refuses_another_shard(runs: Runs, tmp_path: Path) -> None:
    out = tmp_path / "shard1"
    shutil.copytree(runs.shards[0], out)
    half = TRIALS // 2

    assert _ok(_main("run", runs.config, "--out", out, "--shard", "1/2", "--quiet")).startswith(
        f"0 trials run, {half} reused"
    )
    before = _snapshot(out)
    for argv in (["--shard", "2/2"], ["--shard", "1/3"], []):
        _refused(_main("run", runs.config, "--out", out, *argv, "--quiet"), "--out", "shard 1/2")
    _refused(
        _main("run", runs.config, "--out", runs.full, "--shard", "1/2", "--quiet"),
        "holds an unsharded run",
    )
    assert _snapshot(out) == before


def test_partial_merges_are_refused_unless_allowed_and_complete_later(
    runs: Runs, tmp_path: Path
) -> None:
    out = tmp_path / "merged"
    half = TRIALS // 2

    _refused(
        _main("merge", runs.shards[0], "--out", out),
        f"{half} of {TRIALS} trials",
        "from shard 2/2",
        "--allow-partial",
    )
    assert not out.exists()

    partial = _ok(_main("merge", runs.shards[0], "--out", out, "--allow-partial", "--quiet"))

    assert f"{half} trials and 0 trainings missing" in partial
    assert len(pd.read_csv(out / "trials.csv")) == half
    # The missing shard is merged in later: only its trials are added.
    done = _ok(_main("merge", *runs.shards, "--out", out, "--quiet"))
    assert done.startswith(f"merged shard 1/2, 2/2: {half} trials and 0 trainings added;")
    _assert_same_tables(runs.full, out)


def test_run_completes_a_partial_merge(runs: Runs, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    _ok(_main("merge", runs.shards[1], "--out", out, "--allow-partial", "--quiet"))

    summary = _ok(_main("run", runs.config, "--out", out, "--quiet"))

    assert summary.startswith(f"{TRIALS // 2} trials run, {TRIALS // 2} reused")
    _assert_same_tables(runs.full, out)


def test_shards_of_different_configs_are_refused(runs: Runs, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(_config(sigma=(1e-3, 1e-2)), encoding="utf-8")
    shard2 = tmp_path / "other2"
    _ok(_main("run", other, "--out", shard2, "--shard", "2/2", "--quiet"))
    out = tmp_path / "merged"

    _refused(
        _main("merge", runs.shards[0], shard2, "--out", out),
        f"{shard2 / 'config.toml'} differs from {runs.shards[0] / 'config.toml'}",
    )
    assert not out.exists()

    # Nor may a merge write into a directory that holds another config's run.
    target = tmp_path / "target"
    shutil.copytree(shard2, target)
    (target / SHARD_FILE).unlink()
    before = _snapshot(target)
    _refused(_main("merge", *runs.shards, "--out", target), "--out", "different config")
    assert _snapshot(target) == before


def _bad_dirs(runs: Runs, tmp: Path) -> dict[str, tuple[list[Path], Path, str]]:
    """(directories, --out, part of the message) for each refused merge."""
    shard1, shard2 = runs.shards
    empty = tmp / "empty"
    empty.mkdir()
    no_store = tmp / "no-store"
    no_store.mkdir()
    shutil.copy(shard1 / "config.toml", no_store / "config.toml")
    other_split = tmp / "other-split"
    shutil.copytree(shard2, other_split)
    (other_split / SHARD_FILE).write_text('{"count": 3, "index": 2}\n')
    corrupt = tmp / "corrupt"
    shutil.copytree(shard2, corrupt)
    for extra in corrupt.glob("store.sqlite-*"):
        extra.unlink()
    (corrupt / "store.sqlite").write_bytes(b"not a database" * 100)
    out = tmp / "out"
    return {
        "missing-dir": ([shard1, tmp / "nope"], out, f"{tmp / 'nope'} is not a directory"),
        "no-config": ([shard1, empty], out, f"{empty} has no config.toml"),
        "no-store": ([shard1, no_store], out, f"{no_store} has no store.sqlite"),
        "corrupt-store": ([shard1, corrupt], out, "not a leakbench results store"),
        "shard-twice": ([shard1, shard2, shard1], out, "both hold shard 1/2"),
        "other-split": ([shard1, other_split], out, "holds shard 2/3"),
        "out-is-input": ([shard1, shard2], shard2, "one of the merged directories"),
        "out-holds-a-shard": ([shard1], shard2, f"--out {shard2} holds shard 2/2"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing-dir",
        "no-config",
        "no-store",
        "corrupt-store",
        "shard-twice",
        "other-split",
        "out-is-input",
        "out-holds-a-shard",
    ],
)
def test_bad_merges_are_one_line_exit_2_and_write_nothing(
    runs: Runs, tmp_path: Path, case: str
) -> None:
    dirs, out, needle = _bad_dirs(runs, tmp_path)[case]
    inputs = [runs.full, *runs.shards]
    before = {p: (_snapshot(p), _store(p)) for p in inputs}
    listing = sorted(tmp_path.rglob("*"))

    _refused(_main("merge", *dirs, "--out", out), needle)

    assert sorted(tmp_path.rglob("*")) == listing
    assert {p: (_snapshot(p), _store(p)) for p in inputs} == before


# --- utility trainings ----------------------------------------------------------------------


def test_trainings_are_sharded_and_merged(tmp_path: Path) -> None:
    # One seed, two defenses, two replicates each: four trainings (and as few trials as the
    # plan allows).
    training = {"epochs": 1, "batch_size": 512, "seeds": 2, "learning_rates": [1e-3]}
    text = _config(seeds=(0,), images=1, sigma=1e-1, training=training)
    config = tmp_path / "train.toml"
    config.write_text(text, encoding="utf-8")
    trainings = len(plan_training(parse_config(text)))
    assert trainings == 4
    full = tmp_path / "full"
    _ok(_main("run", config, "--out", full, "--quiet"))
    dirs = [tmp_path / f"shard{i}" for i in (1, 2)]
    counts = []
    for i, out in enumerate(dirs, 1):
        summary = _ok(_main("run", config, "--out", out, "--shard", f"{i}/2", "--quiet"))
        counts.append(int(summary.split("; ")[1].split()[0]))
        assert len(pd.read_csv(out / "utility.csv")) == counts[-1]
    assert counts == [2, 2]
    assert list(pd.read_csv(dirs[0] / "utility.csv")["defense"]) == ["none", "none"]

    summary = _ok(_main("merge", *dirs, "--out", tmp_path / "merged", "--quiet"))

    assert f"{trainings} trainings added" in summary
    _assert_same_tables(full, tmp_path / "merged")
    assert len(pd.read_csv(tmp_path / "merged" / "utility.csv")) == trainings
