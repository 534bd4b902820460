"""The command line: one-line errors, a tiny end-to-end run, determinism, resume and `list`.

Most runs call `main` in-process: the attack's XLA program is compiled once per process, so
later runs in the same process are fast. Subprocesses are used where the process is the point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_capture import Result, run_cli
from PIL import Image

from leakbench.attacks import ATTACKS, attacks_of, make_attack
from leakbench.attacks.priors import PRIORS
from leakbench.cli import main
from leakbench.components.models import MODELS
from leakbench.core.canonical import canonical_json
from leakbench.core.seeds import private_indices
from leakbench.datasets import DATASETS, FILE_SOURCES, load_dataset
from leakbench.defenses import DEFENSES
from leakbench.outputs.summary import PRINT_WIDTH
from leakbench.outputs.tables import LEADERBOARD_COLUMNS, TIMING_COLUMNS, TRIAL_COLUMNS, VERDICTS
from leakbench.run.config import load_config, parse_config

IMAGES = 2
SEEDS = (0, 1)
# Every run in this file uses the same attack parameters, so the XLA program compiles once.
ATTACK = '[[attack]]\nname = "idlg"\niterations = 5\n'
TINY = f"""\
name = "tiny"
dataset = "digits"
model = "lenet"
suite = "listed"
images = {IMAGES}
seeds = [{", ".join(map(str, SEEDS))}]

{ATTACK}
[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [1e-3, 1e-1]

[training]
enabled = false  # utility training has its own tests (test_training.py)
"""
CELLS = 3  # idlg x (none, gaussian 1e-3, gaussian 1e-1)
TRIALS = CELLS * IMAGES * len(SEEDS)
OUTPUTS = {"config.toml", "trials.csv", "utility.csv", "leaderboard.csv", "store.sqlite"}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    # The CLI must quiet TensorFlow by itself, so no setting from outside may help it.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _run_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs the CLI in a fresh process, as a user would, with a bounded wait."""
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _trials(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "trials.csv")


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def _assert_same_apart_from_timing(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(_without_timing(_trials(a)), _without_timing(_trials(b)))
    for table in ("leaderboard.csv", "utility.csv"):
        frames = [_without_timing(pd.read_csv(d / table)) for d in (a, b)]
        pd.testing.assert_frame_equal(*frames)


def _summary(result: Result) -> str:
    return result.out.strip().splitlines()[-1]


@dataclasses.dataclass(frozen=True)
class Reference:
    config: Path
    out: Path
    result: Result


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One in-process run of the tiny config (with progress bar and leaderboard)."""
    root = tmp_path_factory.mktemp("reference")
    config = root / "tiny.toml"
    config.write_text(TINY, encoding="utf-8")
    out = root / "out"
    return Reference(config, out, run_cli("run", str(config), "--out", str(out)))


def _copy_run(reference: Reference, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(reference.out, out)
    return out


# --- errors a user can cause ----------------------------------------------------------------

BASE = 'name = "bad"\nsuite = "listed"\nimages = 2\n'


def _bad(top: str = "", attack: str = ATTACK, defense: str = "") -> str:
    return BASE + top + "\n" + attack + defense


GAUSS = '[[defense]]\nname = "gaussian"\n'

# (id, config text or None for a missing file, substring of the message, --out below a file,
# and optionally more arguments of `run`). "{tmp}" in the text is replaced by the test's tmp_path.
BAD_INPUTS = [
    (
        "dpsgd-on-batchnorm",
        _bad(
            'model = "convnet"\n',
            defense='[[defense]]\nname = "dpsgd"\nnoise_multiplier = 1.0\nnorm = 1.0\n',
        ),
        "model convnet has 8 BatchNorm layers",
        False,
    ),
    (
        "batchnorm-of-one-value",
        _bad('model = "resnet18"\n'),
        "BatchNorm layer stage4_block1_bn1 sees one value per channel at batch_size 1",
        False,
    ),
    (
        "bn-statistics-without-batchnorm",
        _bad("[threat_model]\nbn_statistics_known = true\n"),
        "threat_model.bn_statistics_known: model lenet has no BatchNorm layer",
        False,
    ),
    (
        "bn-prior-without-statistics",
        _bad(attack='[[attack]]\nname = "ig"\npriors = [{ name = "bn_statistics" }]\n'),
        "prior bn_statistics needs the batch's BatchNorm statistics",
        False,
    ),
    (
        "bn-statistics-with-clients",
        _bad(
            'model = "convnet"\n[threat_model]\nbn_statistics_known = true\nclients = 2\n',
            attack='[[attack]]\nname = "dlg"\n',
        ),
        "bn_statistics_known with clients above 1",
        False,
    ),
    ("unknown-dataset", _bad('dataset = "nope"\n'), "unknown dataset 'nope'", False),
    ("unknown-file-source", _bad('dataset = "zip:/x"\n'), "unknown file source 'zip'", False),
    ("unknown-model", _bad('model = "nope"\n'), "unknown model 'nope'", False),
    ("unknown-attack", _bad(attack='[[attack]]\nname = "nope"\n'), "unknown attack 'nope'", False),
    ("unknown-defense", _bad(defense='[[defense]]\nname = "nope"\n'), "defense 'nope'", False),
    ("unknown-attack-param", _bad(attack=ATTACK + "steps = 3\n"), "'steps'", False),
    ("unknown-defense-param", _bad(defense=GAUSS + "std = 0.1\n"), "'std'", False),
    ("unknown-top-key", _bad("imagez = 3\n"), "'imagez'", False),
    ("images-string", 'images = "2"\n' + ATTACK, "images", False),
    ("iterations-float", _bad(attack=ATTACK + "restarts = 1.5\n"), "restarts", False),
    ("sigma-string", _bad(defense=GAUSS + 'sigma = "0.1"\n'), "sigma", False),
    ("sigma-negative", _bad(defense=GAUSS + "sigma = -0.1\n"), "sigma", False),
    (
        "ratio-1.5",
        _bad(defense='[[defense]]\nname = "prune"\nratio = 1.5\n'),
        "ratio",
        False,
    ),
    ("images-zero", 'suite = "listed"\nimages = 0\n' + ATTACK, "images", False),
    ("images-above-test-split", 'suite = "listed"\nimages = 451\n' + ATTACK, "(450)", False),
    ("seeds-too-large", _bad("seeds = [9223372036854775807]\n"), "seeds", False),
    ("duplicate-defense", _bad(defense=GAUSS + "sigma = [0.1, 0.1]\n"), "listed twice", False),
    ("idlg-batch-of-2", _bad("batch_size = 2\n"), "batch_size", False),
    ("parallel-trials-zero", _bad("parallel_trials = 0\n"), "parallel_trials", False),
    ("malformed-toml", _bad("images = = 2\n"), "not valid TOML", False),
    (
        "dlg-batch-of-128",
        'suite = "listed"\nimages = 128\nbatch_size = 64\n[[attack]]\nname = "dlg"\n'
        "[threat_model]\nclients = 2\n",
        "batch_size must be <= 64, got 128",
        False,
    ),
    (
        "analytic-on-lenet",
        _bad(attack='[[attack]]\nname = "analytic"\n'),
        "attack analytic: needs a model",
        False,
    ),
    ("ig-lr-zero", _bad(attack='[[attack]]\nname = "ig"\nlr = 0\n'), "lr must be", False),
    ("dlg-loss", _bad(attack='[[attack]]\nname = "dlg"\nloss = "l3"\n'), "loss must be", False),
    (
        "threat-labels-string",
        _bad('[threat_model]\nlabels_known = "yes"\n'),
        "threat_model.labels_known",
        False,
    ),
    ("threat-split", _bad('[threat_model]\nprivate_split = "val"\n'), "private_split", False),
    (
        "images-above-train-split",
        'suite = "listed"\nimages = 2000\n' + ATTACK + '[threat_model]\nprivate_split = "train"\n',
        "train split",
        False,
    ),
    ("missing-config-file", None, "does not exist", False),
    ("missing-data-file", _bad('dataset = "npz:/nonexistent.npz"\n'), "/nonexistent.npz", False),
    ("npz-without-x", _bad('dataset = "npz:{tmp}/noimages.npz"\n'), "missing array 'x'", False),
    (
        "folder-corrupt-image",
        _bad('dataset = "folder:{tmp}/corrupt"\n'),
        "b/1.png: not a readable image",
        False,
    ),
    (
        "folder-empty-class",
        _bad('dataset = "folder:{tmp}/emptyclass"\n'),
        "class folder holds no image files",
        False,
    ),
    ("schema-version", _bad("schema_version = 2\n"), "schema_version must be 1", False),
    (
        "training-rates-empty",
        _bad("[training]\nlearning_rates = []\n"),
        "training.learning_rates must be a list of 1 to 8 distinct numbers in (0.0, 10.0), got []",
        False,
    ),
    (
        "training-validation-above-1",
        _bad("[training]\nvalidation = 1.5\n"),
        "training.validation must be a number in [0.0, 1.0), got 1.5",
        False,
    ),
    (
        "training-seeds-zero",
        _bad("[training]\nseeds = 0\n"),
        "training.seeds must be an integer in [1, 100], got 0",
        False,
    ),
    (
        "training-dp-batch-above-split",
        _bad(
            "[training.dp]\nbatch_size = 1300\n",
            defense='[[defense]]\nname = "dpsgd"\nnoise_multiplier = 1.0\nnorm = 1.0\n',
        ),
        "training.dp.batch_size must be at most the size of digits's training split less its "
        "validation split (1212), got 1300",
        False,
    ),
    (
        "soteria-share-above-1",
        _bad(defense='[[defense]]\nname = "soteria"\nshare = 1.5\n'),
        "defense soteria: share must be in [0, 1], got 1.5",
        False,
    ),
    (
        "mixup-larger-than-the-batch",
        _bad(defense='[[defense]]\nname = "mixup"\nmixed = 3\n'),
        "defense mixup mixes 3 examples of the client's batch, so batch_size must be at least 3",
        False,
    ),
    (
        "precode-under-fedavg",
        _bad(
            "[threat_model]\nlocal_steps = 2\n",
            defense='[[defense]]\nname = "precode"\nsize = 8\n',
        ),
        "defense precode samples inside the model",
        False,
    ),
    (
        "attack-noise-unknown",
        _bad(attack='[[attack]]\nname = "dlg"\nnoise = "guess"\n'),
        "attack dlg: noise must be 'sample' or 'learn', got 'guess'",
        False,
    ),
    ("out-below-a-file", _bad(), "--out", True),
    ("shard-above-count", _bad(), "--shard must be I/N with integers 1 <= I <= N", False, "3/2"),
    ("shard-not-numbers", _bad(), "--shard must be I/N", False, "a/b"),
]


@pytest.mark.parametrize(
    ("text", "needle", "below_file", "shard"),
    [
        pytest.param(*case[1:4], case[4] if len(case) > 4 else None, id=case[0])
        for case in BAD_INPUTS
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, text: str | None, needle: str, below_file: bool, shard: str | None
) -> None:
    np.savez(tmp_path / "noimages.npz", y=np.zeros(4, np.int64))
    for name, second in (("corrupt", b"not a png" * 20), ("emptyclass", None)):
        for folder in ("a", "b"):
            (tmp_path / name / folder).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(
                tmp_path / name / "a" / f"{i}.png"
            )
        if second is not None:
            (tmp_path / name / "b" / "1.png").write_bytes(second)
    (tmp_path / "plain-file").write_text("not a directory")
    config = tmp_path / "config.toml"
    if text is not None:
        config.write_text(text.replace("{tmp}", str(tmp_path)), encoding="utf-8")
    out = tmp_path / "plain-file" / "out" if below_file else tmp_path / "out"
    before = sorted(tmp_path.rglob("*"))

    extra = ["--shard", shard] if shard is not None else []
    result = run_cli("run", str(config), "--out", str(out), "--quiet", *extra)

    assert result.code == 2
    assert result.err.endswith("\n") and len(result.err.splitlines()) == 1, result.err
    assert result.err.startswith("leakbench: error: ")
    assert needle in result.err
    assert "Traceback" not in result.out + result.err
    assert result.out == ""
    assert not out.exists()
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("images.x=1", "--set 'images.x=1': images is a value, not a table"),
        ("images=0", "images must be an integer in [1, 100000], got 0"),
        ("imagez=3", "unknown key 'imagez'"),
    ],
)
def test_a_bad_set_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, setting: str, needle: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(_bad(), encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))

    out = str(tmp_path / "out")
    result = run_cli("run", str(config), "--set", setting, "--out", out, "--quiet")

    assert result.code == 2
    assert result.err.startswith("leakbench: error: ") and len(result.err.splitlines()) == 1
    assert needle in result.err, result.err
    assert result.out == ""
    assert sorted(tmp_path.rglob("*")) == before


def test_an_unwritable_out_dir_is_refused(tmp_path: Path) -> None:
    # /sys refuses new directories even to root (file modes would not stop a root CI user).
    out = Path("/sys/leakbench-test/out")
    try:
        out.parent.mkdir()
    except OSError:
        pass  # what the test needs: a place where nobody can create a directory
    else:
        out.parent.rmdir()
        pytest.skip("/sys accepts new directories here; no unwritable place to test with")
    config = tmp_path / "config.toml"
    config.write_text(_bad(), encoding="utf-8")

    result = run_cli("run", str(config), "--out", str(out), "--quiet")

    assert result.code == 2
    assert len(result.err.splitlines()) == 1
    assert result.err.startswith("leakbench: error: --out /sys/leakbench-test/out")
    assert "not a writable directory" in result.err
    assert not out.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_a_corrupt_store_is_reported_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(_bad(), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "store.sqlite").write_bytes(b"this is not a database" * 10)

    result = run_cli("run", str(config), "--out", str(out), "--quiet")

    assert result.code == 2
    assert len(result.err.splitlines()) == 1
    assert result.err.startswith("leakbench: error: ") and "store.sqlite" in result.err
    # Only the (empty) lock file was added: it stays, as the lock of every later run here.
    assert sorted(p.name for p in out.iterdir()) == [".leakbench.run.lock", "store.sqlite"]
    assert (out / ".leakbench.run.lock").stat().st_size == 0


# --- a tiny end-to-end run ------------------------------------------------------------------


def test_run_writes_the_tables(reference: Reference) -> None:
    result, out = reference.result, reference.out
    assert result.code == 0, result.err
    assert OUTPUTS <= {p.name for p in out.iterdir()}
    assert parse_config((out / "config.toml").read_text(encoding="utf-8")) == load_config(
        reference.config
    )

    trials = _trials(out)
    assert list(trials.columns) == TRIAL_COLUMNS
    assert len(trials) == TRIALS
    assert set(trials["status"]) == {"ok"}
    assert set(trials["defense_params"]) == {"{}", '{"sigma":0.001}', '{"sigma":0.1}'}
    # At most the 5 of the config, or twice that for a trial the judge reran (it neither
    # converged nor leaked: `leakbench.run.judge`).
    assert (trials["iterations"] <= 5 * (1 + trials["escalations"])).all()
    # Every cell attacks the same images under every seed (paired comparisons).
    digits = load_dataset("digits")
    expected = sorted(
        (seed, int(i)) for seed in SEEDS for i in private_indices(len(digits.test), IMAGES, seed)
    )
    cells = trials.groupby(["attack", "attack_params", "defense", "defense_params"])
    assert len(cells) == CELLS
    for _, cell in cells:
        assert sorted(zip(cell["seed"], cell["image_index"], strict=True)) == expected
    assert (trials["label"].to_numpy() == digits.test.y[trials["image_index"].to_numpy()]).all()

    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.columns) == LEADERBOARD_COLUMNS
    assert len(board) == CELLS
    assert set(board["n"]) == {IMAGES * len(SEEDS)}
    by_cell = trials.groupby("defense_params")["psnr"].mean()
    board_psnr = board.set_index("defense_params")["psnr_mean"].sort_index()
    np.testing.assert_allclose(board_psnr.to_numpy(), by_cell.to_numpy(), rtol=1e-9)
    assert list(board_psnr.index) == list(by_cell.index)

    # The leaderboard's headline rows are printed, then a summary line.
    lines = result.out.splitlines()
    assert lines[0].split()[:3] == ["verdict", "rank", "defense"]
    assert all(len(line) <= PRINT_WIDTH for line in lines[:-1])
    # The summary names the run directory: with the default one (runs/<name>) it fits too.
    default_out = len("runs/") + len("tiny")
    assert len(lines[-1]) - len(str(reference.out)) + default_out <= PRINT_WIDTH
    # Progress bars and notices too, and no library warning reaches the user.
    err_lines = [part for line in result.err.splitlines() for part in line.split("\r")]
    assert all(len(line) <= PRINT_WIDTH for line in err_lines), max(err_lines, key=len)
    # (the tiny attack's 5 iterations do earn leakbench's own budget warning)
    assert all(line.startswith("leakbench: ") for line in err_lines if "warn" in line.lower())
    # The header, a line per defense configuration (verdict first), then the verdicts in words,
    # the legend and the rule, and last the summary.
    rows = lines[1 : 1 + CELLS]
    assert sum("gaussian" in line for line in rows) == 2
    assert all(line.split()[0] in VERDICTS for line in rows)
    assert any(
        line.startswith("verdict (protocol 2): from the images leaked")
        for line in lines[1 + CELLS :]
    )
    assert _summary(result).startswith(f"{TRIALS} trials run, 0 reused")
    assert "Traceback" not in result.err


def test_result_files_get_the_usual_permissions(reference: Reference, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    mode = stat.S_IMODE(plain.stat().st_mode)
    for name in OUTPUTS:
        assert stat.S_IMODE((reference.out / name).stat().st_mode) == mode, name


def test_same_config_and_seed_give_the_same_trials_in_another_process(
    reference: Reference, tmp_path: Path
) -> None:
    out = tmp_path / "again"
    proc = _run_process(
        [sys.executable, "-m", "leakbench.cli", "run", str(reference.config)]
        + ["--out", str(out), "--quiet"],
        tmp_path,
    )

    assert proc.returncode == 0, proc.stderr
    assert (out / "config.toml").read_bytes() == (reference.out / "config.toml").read_bytes()
    _assert_same_apart_from_timing(reference.out, out)


# --- resume ---------------------------------------------------------------------------------


def test_rerun_reuses_every_trial_and_rewrites_the_same_tables(
    reference: Reference, tmp_path: Path
) -> None:
    out = _copy_run(reference, tmp_path)

    result = run_cli("run", str(reference.config), "--out", str(out), "--quiet")

    assert result.code == 0, result.err
    assert _summary(result).startswith(f"0 trials run, {TRIALS} reused")
    for name in ("trials.csv", "leaderboard.csv", "config.toml"):
        assert (out / name).read_bytes() == (reference.out / name).read_bytes(), name


def test_deleted_trials_are_rerun_and_give_the_same_tables(
    reference: Reference, tmp_path: Path
) -> None:
    out = _copy_run(reference, tmp_path)
    with contextlib.closing(sqlite3.connect(out / "store.sqlite")) as db, db:
        keys = sorted(k for (k,) in db.execute("SELECT key FROM trials"))
        assert len(keys) == TRIALS
        gone = keys[::4]
        db.executemany("DELETE FROM trials WHERE key = ?", [(k,) for k in gone])

    result = run_cli("run", str(reference.config), "--out", str(out), "--quiet")

    assert result.code == 0, result.err
    assert _summary(result).startswith(f"{len(gone)} trials run, {TRIALS - len(gone)} reused")
    _assert_same_apart_from_timing(reference.out, out)
    # Reused rows come back from the store as they were, timings included.
    before, after = _trials(reference.out), _trials(out)
    # batch_size 1: one row per trial.
    assert (before["seconds"] == after["seconds"]).sum() >= TRIALS - len(gone)


def test_a_changed_config_is_refused_unless_extended(reference: Reference, tmp_path: Path) -> None:
    out = _copy_run(reference, tmp_path)
    changed = tmp_path / "changed.toml"
    changed.write_text(
        TINY.replace("sigma = [1e-3, 1e-1]", "sigma = [1e-2]"),
        encoding="utf-8",
    )
    snapshot = {
        p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "store.sqlite"
    }

    refused = run_cli("run", str(changed), "--out", str(out), "--quiet")

    assert refused.code == 2
    assert len(refused.err.splitlines()) == 1
    assert refused.err.startswith("leakbench: error: ") and "--extend" in refused.err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in snapshot} == snapshot

    extended = run_cli("run", str(changed), "--out", str(out), "--extend", "--quiet")

    assert extended.code == 0, extended.err
    per_cell = IMAGES * len(SEEDS)
    # The no-defense cell is shared with the old config and reused.
    assert _summary(extended).startswith(f"{per_cell} trials run, {per_cell} reused")
    trials = _trials(out)
    assert set(trials["defense_params"]) == {"{}", '{"sigma":0.01}'}
    assert len(trials) == 2 * per_cell
    assert len(pd.read_csv(out / "leaderboard.csv")) == 2
    assert load_config(out / "config.toml") == load_config(changed)

    # The store keeps the old trials: extending back runs nothing.
    back = run_cli("run", str(reference.config), "--out", str(out), "--extend", "--quiet")

    assert back.code == 0, back.err
    assert _summary(back).startswith(f"0 trials run, {TRIALS} reused")
    _assert_same_apart_from_timing(reference.out, out)


def test_a_config_that_differs_only_in_spelling_resumes(
    reference: Reference, tmp_path: Path
) -> None:
    out = _copy_run(reference, tmp_path)
    spelled = tmp_path / "spelled.toml"
    # Same run: keys reordered, defaults spelled out, comments and a float written as 0.1.
    spelled.write_text(
        TINY.replace(
            "iterations = 5", "# comment\nrestarts = 2\niterations = 5\nhistory_size = 100"
        )
        .replace("1e-1]", "0.1]")
        .replace('model = "lenet"\n', "success_mse = 0.001\n" + 'model = "lenet"\n'),
        encoding="utf-8",
    )

    result = run_cli("run", str(spelled), "--out", str(out), "--quiet")

    assert result.code == 0, result.err
    assert _summary(result).startswith(f"0 trials run, {TRIALS} reused")


NOTICE = "leakbench: warning: attack idlg: 'restarts' is deprecated; use 'retries' (same meaning)"


def test_an_old_parameter_name_is_one_warning_line_and_the_new_name_is_written(
    reference: Reference, tmp_path: Path
) -> None:
    out = _copy_run(reference, tmp_path)
    old = tmp_path / "old.toml"
    old.write_text(TINY.replace("iterations = 5", "iterations = 5\nrestarts = 2"), encoding="utf-8")

    result = run_cli("run", str(old), "--out", str(out), "--quiet")

    assert result.code == 0, result.err
    # The tiny config's 5 iterations also earn the budget warning, a line of its own.
    assert [line for line in result.err.splitlines() if "iteration budget" not in line] == [NOTICE]
    assert "Traceback" not in result.out + result.err
    # The same run as the reference (the old name means the same), resolved with the new name.
    assert _summary(result).startswith(f"0 trials run, {TRIALS} reused")
    written = (out / "config.toml").read_text(encoding="utf-8")
    assert written == (reference.out / "config.toml").read_text(encoding="utf-8")
    assert "retries = 2" in written and "restarts" not in written


def test_an_old_parameter_name_turned_into_an_error_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(_bad(attack=ATTACK + "restarts = 1\n"), encoding="utf-8")

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # as `python -W error` would
        result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")

    assert result.code == 2
    assert result.err.splitlines() == [NOTICE.replace("warning", "error")]
    assert not (tmp_path / "out").exists()


def test_the_console_script_prints_an_old_parameter_name_as_one_line(tmp_path: Path) -> None:
    script = _console_script()
    if script is None:
        pytest.skip("the leakbench console script is not installed (pip install -e .)")
    config = tmp_path / "config.toml"
    # A config that fails after it was read: the notice comes first, then the error.
    config.write_text(
        'suite = "listed"\nimages = 451\n' + ATTACK + "restarts = 1\n", encoding="utf-8"
    )

    proc = _run_process([script, "run", str(config), "--out", str(tmp_path / "out")], tmp_path)

    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("leakbench: ")]
    assert lines == [NOTICE, lines[1]] and "(450)" in lines[1]
    assert "Traceback" not in proc.stderr and "FutureWarning" not in proc.stderr


# --- leakbench list -------------------------------------------------------------------------


def test_list_mentions_every_registered_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out, err = capsys.readouterr()

    assert err == ""
    sections: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            sections[line.rstrip(":")] = []
        else:
            sections[list(sections)[-1]].append(line)
    assert list(sections) == ["datasets", "models", "attacks", "priors", "defenses", "suites"]
    assert {line.split()[0] for line in sections["suites"] if line[2] != " "} == {
        "standard", "listed"
    }  # fmt: skip
    first_words = {key: {line.split()[0] for line in lines} for key, lines in sections.items()}
    assert set(PRIORS) <= first_words["priors"]
    # One registry per kind: every dataset, file source and model is listed once, with its
    # modality, as the attacks are.
    marked = {
        key: {line.split()[0]: line.split()[1] for line in sections[key]}
        for key in ("datasets", "models")
    }
    assert marked["datasets"] == {
        **{name: f"[{DATASETS.modality_of(name)}]" for name in DATASETS},
        **{f"{p}:PATH": f"[{FILE_SOURCES.modality_of(p)}]" for p in FILE_SOURCES},
    }
    assert marked["models"] == {name: f"[{MODELS.modality_of(name)}]" for name in MODELS}
    assert marked["datasets"]["tinyshakespeare"] == marked["datasets"]["text:PATH"] == "[text]"
    assert marked["datasets"]["digits"] == marked["datasets"]["npz:PATH"] == "[image]"
    assert marked["models"]["gru"] == "[text]" and marked["models"]["lenet"] == "[image]"
    # One attack registry: every attack is listed with its modality.
    modality = {line.split()[0]: line.split()[1] for line in sections["attacks"] if line[2] != " "}
    assert {name: ATTACKS.get(name).modality for name in ATTACKS} == {
        name: modality[name].strip("[]") for name in ATTACKS
    }
    assert {"bag_of_words", "span", "tag"} <= {n for n, m in modality.items() if m == "[text]"}
    # The registry keeps an attack's modality (its class's) as it keeps a dataset's.
    assert {name: ATTACKS.modality_of(name) for name in ATTACKS} == {
        name: ATTACKS.get(name).modality for name in ATTACKS
    }
    assert ATTACKS.names("text") == attacks_of("text").names()
    for key, registry in (("attacks", ATTACKS), ("defenses", DEFENSES)):
        assert set(registry) <= first_words[key]
        text = "\n".join(sections[key])
        for name in registry:
            for field in dataclasses.fields(registry.get(name)):
                assert f"{field.name}=" in text, (name, field.name)


# --- the console script ---------------------------------------------------------------------


def _console_script() -> str | None:
    found = shutil.which("leakbench")
    if found:
        return found
    beside = Path(sys.executable).parent / "leakbench"
    return str(beside) if beside.exists() else None


def test_console_script_runs_end_to_end_without_native_noise(tmp_path: Path) -> None:
    script = _console_script()
    if script is None:
        pytest.skip("the leakbench console script is not installed (pip install -e .)")
    config = tmp_path / "one.toml"
    config.write_text(
        f'name = "one"\nsuite = "listed"\nimages = 1\n{ATTACK}[[defense]]\nname = "none"\n'
        "[training]\nenabled = false\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"

    proc = _run_process([script, "run", str(config), "--out", str(out), "--quiet"], tmp_path)

    assert proc.returncode == 0, proc.stderr
    noisy = [line for line in proc.stderr.splitlines() if "cuInit" in line or "cudart" in line]
    assert noisy == []
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("1 trials run, 0 reused")
    assert len(_trials(out)) == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "required: command"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(argv: list[str], needle: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("leakbench: error:") and needle in lines[0]


def test_attack_groups_come_from_the_plan_per_seed_and_attack() -> None:
    """Groups are cut from the whole plan (never from what is left to do), one model and one
    attack configuration each, so a resumed run attacks the same groups."""
    from leakbench.run.plan import attack_groups, plan

    spec = parse_config(TINY.replace(ATTACK, ATTACK + '\n[[attack]]\nname = "dlg"\n'))
    trials = plan(spec, load_dataset("digits"))
    groups = attack_groups(trials, 4)
    assert sorted(t.key for g in groups for t in g) == sorted(t.key for t in trials)
    assert all(len({(t.seed, t.attack.name) for t in g}) == 1 for g in groups)
    per_run = CELLS * IMAGES  # trials of one (seed, attack)
    # Piece by piece, every attack's piece of the same cells next to each other.
    assert [len(g) for g in groups] == [4, 4, per_run - 4, per_run - 4] * len(SEEDS)
    assert [g[0].attack.name for g in groups[:4]] == ["idlg", "dlg", "idlg", "dlg"]
    assert [t.indices for t in groups[0]] == [t.indices for t in groups[1]]


def test_printed_attack_names_show_only_changed_parameters() -> None:
    from leakbench.outputs.naming import attack_label

    defaults = canonical_json(make_attack("dlg").params())
    adaptive = canonical_json(make_attack("dlg", match="kept", loss="cosine").params())
    assert attack_label("dlg", defaults) == "dlg"
    assert attack_label("dlg", adaptive) == "dlg loss=cosine match=kept"


def test_printed_attack_names_of_runs_stored_with_old_parameter_names() -> None:
    # Runs stored before restarts was renamed keep their short labels.
    from leakbench.outputs.naming import attack_label

    old_dlg = {**make_attack("dlg").params(), "restarts": 2}
    del old_dlg["retries"]
    assert attack_label("dlg", canonical_json(old_dlg)) == "dlg"
    assert attack_label("dlg", canonical_json({**old_dlg, "restarts": 1})) == "dlg retries=1"
    old_ig = {k: v for k, v in make_attack("ig").params().items() if k not in ("retries", "starts")}
    assert attack_label("ig", canonical_json({**old_ig, "restarts": 0})) == "ig"
    assert attack_label("ig", canonical_json({**old_ig, "restarts": 2})) == "ig starts=3"


def test_the_backend_choices_are_the_declared_backends(monkeypatch, capsys) -> None:
    # A backend another package declares in the entry-point group is a choice of --backend.
    import importlib.metadata

    from leakbench.run import backends

    declared = importlib.metadata.EntryPoint(
        name="spark", value="somewhere:SparkBackend", group=backends.GROUP
    )
    real = importlib.metadata.entry_points

    def entry_points(**kwargs):
        found = list(real(**kwargs))
        return [*found, declared] if kwargs.get("group") == backends.GROUP else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert backends.backend_names() == ["local", "ray", "spark"]
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "{local,ray,spark}" in capsys.readouterr().out
