"""`leakbench board` over hostile submissions (issue 63, acceptance items 1 and 3).

One honest tiny run is made once for the file; every hostile entry is a copy of it with one
thing changed. Checked here:

- forgeries (an edited leaderboard, impossible counts, an over-claimed n, non-finite intervals,
  unknown verdicts, trial scores edited and rescored without their arrays) are shown apart with
  their reason, and a hand-written ``verification.json``, even one keyed by the hash the board's
  ledger uses, never makes an entry ``verified``: only the board's own ledger does;
- malformed submissions, all in one board: each is apart in one line, the honest entry stands,
  the board is built (exit 0) and no traceback is printed;
- small inputs that would do large damage: a huge provenance string, symbolic links (the run
  directory itself, a link loop, a link out of the submission), a FIFO, a control character in
  the name, spreadsheet formula cells;
- ``--verify`` refuses a linked submission in one line before it copies anything.

A defect found while writing these is a strict xfail naming it: it fails once it is fixed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from cli_capture import Result, run_cli

from leakbench.outputs.arrays import cell_id
from leakbench.outputs.board import config_sha256
from leakbench.outputs.naming import defense_label
from leakbench.run.board_build import build_board
from leakbench.run.ledger import LEDGER_FILE, LEDGER_FORMAT, entry_sha256

RUN = """\
name = "honest"
dataset = "digits"
model = "lenet"
suite = "listed"
images = 2
seeds = [0]

[[attack]]
name = "idlg"
iterations = 5

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [1e-3, 1e-1]

[training]
enabled = false
"""
# The honest run's configurations; sigma=0.001 is broken (its images leak), the others are not.
BROKEN = '{"sigma":0.001}'
CONFIGURATIONS = 3
# What a hostile entry's reason may be at most (one line).
MAX_REASON = 300
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

Mutation = Callable[[Path], None]


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one run every entry of this file is a copy of: 2 digits, idlg, 3 defense settings."""
    root = tmp_path_factory.mktemp("hostile")
    config = root / "honest.toml"
    config.write_text(RUN)
    result = run_cli("run", str(config), "--out", str(root / "honest"), "--quiet")
    assert result.code == 0, result.err
    return root / "honest"


def _copy(honest: Path, folder: Path) -> Path:
    """A copy of the honest run as a submission would hold it (no store, no lock)."""
    shutil.copytree(
        honest,
        folder,
        ignore=shutil.ignore_patterns("store.sqlite*", "*.lock", "partial", "report.html"),
    )
    return folder


def _board(*folders: Path, out: Path, extra: tuple[str, ...] = ()) -> Result:
    return run_cli("board", *map(str, folders), "--out", str(out), "--quiet", *extra)


def _apart(site: Path) -> dict[str, str]:
    apart = pd.read_csv(site / "apart.csv", dtype=str, keep_default_na=False)
    return dict(zip(apart["run_dir"], apart["reason"], strict=True))


def _rows(site: Path) -> pd.DataFrame:
    return pd.read_csv(site / "board.csv", dtype=str, keep_default_na=False)


def _assert_honest_stands(result: Result, site: Path, honest: Path) -> None:
    assert result.code == 0, result.err
    assert "Traceback" not in result.err, result.err
    rows = _rows(site)
    assert (rows["run_dir"] == str(honest)).sum() == CONFIGURATIONS, rows["run_dir"].tolist()
    assert str(honest) not in _apart(site)


def _assert_one_line(reason: str) -> None:
    assert reason and "\n" not in reason and "\r" not in reason, repr(reason)
    assert len(reason) <= MAX_REASON, reason


def _assert_apart(result: Result, site: Path, folder: Path, *fragments: str) -> str:
    """``folder`` is apart in apart.csv and in the printed output with one line holding each of
    ``fragments``; none of its rows is on the board. Returns the reason."""
    apart = _apart(site)
    assert str(folder) in apart, (folder.name, apart, result.err[-2000:])
    reason = apart[str(folder)]
    _assert_one_line(reason)
    for fragment in fragments:
        assert fragment in reason, (folder.name, reason)
    assert f"shown apart: {folder}: {reason}" in result.out.splitlines(), result.out
    assert not (_rows(site)["run_dir"] == str(folder)).any()
    return reason


# --- editing a copy ----------------------------------------------------------------------------


def _table(folder: Path, name: str) -> pd.DataFrame:
    """A CSV of the copy as text (written back with `_put`, its untouched cells unchanged)."""
    return pd.read_csv(folder / name, dtype=str, keep_default_na=False)


def _put(frame: pd.DataFrame, folder: Path, name: str) -> None:
    frame.to_csv(folder / name, index=False)


def _edit(name: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Mutation:
    def mutate(folder: Path) -> None:
        _put(change(_table(folder, name)), folder, name)

    return mutate


def _cell(name: str, column: str, value: str, row: int = 0) -> Mutation:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        frame.loc[row, column] = value
        return frame

    return _edit(name, change)


def _drop_column(name: str, column: str) -> Mutation:
    return _edit(name, lambda frame: frame.drop(columns=[column]))


def _rehash(folder: Path) -> None:
    """Records the config's hash again, as a submitter who edited it can."""
    environment = json.loads((folder / "environment.json").read_text())
    environment["config_sha256"] = config_sha256((folder / "config.toml").read_text())
    (folder / "environment.json").write_text(json.dumps(environment))


def _config(change: Callable[[str], str]) -> Mutation:
    """The config edited and its recorded hash made to match (so the parse is what is tested)."""

    def mutate(folder: Path) -> None:
        path = folder / "config.toml"
        path.write_text(change(path.read_text()))
        _rehash(folder)

    return mutate


def _write(name: str, data: bytes) -> Mutation:
    return lambda folder: (folder / name).write_bytes(data)


def _noise(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def _remove(name: str) -> Mutation:
    return lambda folder: (folder / name).unlink()


def _arrays(folder: Path) -> list[Path]:
    return sorted((folder / "arrays").glob("*.npz"))


def _wrong_shapes(folder: Path) -> None:
    path = _arrays(folder)[0]
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["reconstruction"] = arrays["reconstruction"][:, :4, :4]
    np.savez_compressed(path, **arrays)


def _rename_dataset(folder: Path) -> None:
    """An unknown dataset named consistently in the config, the trials and the leaderboard."""
    _config(lambda text: text.replace('dataset = "digits"', 'dataset = "no-such-dataset"'))(folder)
    for name in ("trials.csv", "leaderboard.csv"):
        _put(_table(folder, name).assign(dataset="no-such-dataset"), folder, name)


def _relabel(folder: Path, defense: str) -> None:
    """The gaussian rows renamed ``defense`` consistently: in trials.csv, in the names of their
    arrays (`leakbench.outputs.arrays.cell_id`, public), and in the leaderboard, which
    `leakbench rescore` recomputes from them."""
    trials = _table(folder, "trials.csv")
    renamed = trials.copy()
    renamed.loc[renamed["defense"] == "gaussian", "defense"] = defense
    moves = {
        cell_id(a): cell_id(b)
        for (_, a), (_, b) in zip(trials.iterrows(), renamed.iterrows(), strict=True)
    }
    arrays = {new: (folder / "arrays" / f"{old}.npz").read_bytes() for old, new in moves.items()}
    for path in _arrays(folder):
        path.unlink()
    for name, data in arrays.items():
        (folder / "arrays" / f"{name}.npz").write_bytes(data)
    _put(renamed, folder, "trials.csv")
    assert run_cli("rescore", str(folder)).code == 0


def _latin1_environment(folder: Path) -> None:
    text = (folder / "environment.json").read_text().replace('"3.', '"café 3.')
    (folder / "environment.json").write_bytes(text.encode("latin-1"))


def _latin1_config(folder: Path) -> None:
    text = (folder / "config.toml").read_text().replace('name = "honest"', 'name = "café"')
    (folder / "config.toml").write_bytes(text.encode("latin-1"))


def _header_only(folder: Path) -> None:
    header = (folder / "leaderboard.csv").read_text().splitlines()[0]
    (folder / "leaderboard.csv").write_text(header + "\n")


def _duplicate_row(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([frame, frame.iloc[[0]]], ignore_index=True)


def _foreign_cell(frame: pd.DataFrame) -> pd.DataFrame:
    extra = frame.iloc[[-1]].assign(defense="gaussian", defense_params='{"sigma":0.5}')
    return pd.concat([frame, extra], ignore_index=True)


# Malformed submissions the board lets stand today, with why that is a defect (reported).
STANDS_TODAY: dict[str, str] = {}
# (name, mutation, a fragment the reason must hold): each makes a copy that cannot stand.
MALFORMED: list[tuple[str, Mutation, str]] = [
    ("leaderboard-defense-params-not-json", _cell("leaderboard.csv", "defense_params", "{oops"),
     "do not hold"),
    ("leaderboard-attack-params-not-json", _cell("leaderboard.csv", "attack_params", "{oops"),
     "do not hold"),
    ("trials-defense-params-not-json", _cell("trials.csv", "defense_params", "{oops"),
     "does not plan"),
    ("trials-attack-params-not-json", _cell("trials.csv", "attack_params", "{oops"),
     "does not plan"),
    ("leaderboard-without-dataset", _drop_column("leaderboard.csv", "dataset"), "dataset"),
    ("leaderboard-without-verdict", _drop_column("leaderboard.csv", "verdict"), "verdict"),
    ("trials-without-defense", _drop_column("trials.csv", "defense"), "defense"),
    ("leaderboard-empty", _write("leaderboard.csv", b""), ""),
    ("leaderboard-header-only", _header_only, "no rows"),
    ("leaderboard-binary", _write("leaderboard.csv", _noise(4096, 1)), ""),
    ("trials-binary", _write("trials.csv", _noise(4096, 2)), ""),
    ("trials-empty", _write("trials.csv", b""), ""),
    ("config-latin-1", _latin1_config, "UTF-8"),
    ("config-not-toml", _config(lambda text: "this is [not toml\n"), "TOML"),
    ("config-clients-many", _config(lambda t: t.replace("clients = 1", 'clients = "many"')),
     "clients"),
    ("config-images-negative", _config(lambda t: t.replace("images = 2", "images = -1")),
     "images"),
    ("config-unknown-dataset", _rename_dataset, "no-such-dataset"),
    ("trials-unknown-defense", _edit("trials.csv", lambda f: f.replace("gaussian", "nodefense")),
     "does not plan"),
    ("environment-not-json", _write("environment.json", b"{not json"), "environment.json"),
    ("environment-a-json-list", _write("environment.json", b"[1, 2, 3]"), "environment.json"),
    ("environment-latin-1", _latin1_environment, "environment.json"),
    ("utility-binary", _write("utility.csv", _noise(4096, 3)), ""),
    ("utility-missing", _remove("utility.csv"), "utility.csv"),
    ("trials-missing", _remove("trials.csv"), "trials.csv"),
    ("config-missing", _remove("config.toml"), "config.toml"),
    ("leaderboard-missing", _remove("leaderboard.csv"), "leaderboard.csv"),
    ("arrays-random-bytes", lambda folder: _arrays(folder)[0].write_bytes(_noise(2048, 4)),
     "arrays/"),
    ("arrays-wrong-shapes", _wrong_shapes, "arrays/"),
    ("leaderboard-duplicated-row", _edit("leaderboard.csv", _duplicate_row), "twice"),
    ("leaderboard-foreign-cell", _edit("leaderboard.csv", _foreign_cell), "do not hold"),
    ("leaderboard-missing-cell", _edit("leaderboard.csv", lambda f: f.iloc[:-1]), "leaves out"),
    ("trials-seed-not-a-number", _cell("trials.csv", "seed", "x"), ""),
]  # fmt: skip


@pytest.fixture(scope="module")
def malformed(honest: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    """One board over the honest run and every malformed copy of it: its CLI result and site."""
    root = tmp_path_factory.mktemp("malformed")
    folders = []
    for name, mutate, _ in MALFORMED:
        folders.append(_copy(honest, root / name))
        mutate(folders[-1])
    site = root / "site"
    return _board(honest, *folders, out=site), site


def test_the_board_of_every_malformed_submission_is_built_with_the_honest_entry_shown(
    malformed: tuple[Result, Path], honest: Path
) -> None:
    result, site = malformed
    _assert_honest_stands(result, site, honest)
    apart = {Path(folder).name for folder in _apart(site)}
    assert apart >= {name for name, _, _ in MALFORMED} - set(STANDS_TODAY)
    assert f"{len(apart)} run directories apart" in result.out
    for page in ("board.html", "index.md"):
        assert (site / page).stat().st_size > 0


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(m, id=m[0], marks=[pytest.mark.xfail(reason=STANDS_TODAY[m[0]], strict=True)])
        if m[0] in STANDS_TODAY
        else pytest.param(m, id=m[0])
        for m in MALFORMED
    ],
)
def test_a_malformed_submission_is_apart_in_one_line(
    case: tuple[str, Mutation, str], malformed: tuple[Result, Path]
) -> None:
    name, _, fragment = case
    result, site = malformed
    _assert_apart(result, site, site.parent / name, fragment)


@pytest.mark.parametrize(
    "name", ["leaderboard-defense-params-not-json", "config-latin-1", "leaderboard-binary"]
)
def test_a_malformed_submission_alone_beside_the_honest_one_is_apart(
    name: str, honest: Path, tmp_path: Path
) -> None:
    # The cases that were tracebacks before the board read submissions as hostile, each in a
    # board of its own: the board is still built, with the honest entry.
    mutate = {n: m for n, m, _ in MALFORMED}[name]
    bad = _copy(honest, tmp_path / name)
    mutate(bad)
    site = tmp_path / "site"
    result = _board(honest, bad, out=site)
    _assert_honest_stands(result, site, honest)
    _assert_apart(result, site, bad)
    assert len(result.out.strip().splitlines()) == 2  # one apart line, one summary line


# --- forgeries ---------------------------------------------------------------------------------


def test_an_honest_copy_stands_with_every_row_checked_against_its_arrays(
    honest: Path, tmp_path: Path
) -> None:
    copy = _copy(honest, tmp_path / "copy")
    site = tmp_path / "site"
    result = _board(honest, copy, out=site)
    _assert_honest_stands(result, site, honest)
    _assert_honest_stands(result, site, copy)
    assert _apart(site) == {}
    rows = _rows(site)
    trials = pd.read_csv(honest / "trials.csv")
    assert set(rows["metrics_checked"]) == {f"{len(trials)} of {len(trials)} rows against arrays/"}
    assert set(rows["verification"]) == {"not verified"}
    mine = rows[rows["run_dir"] == str(copy)].set_index("defense_params")
    assert mine.at[BROKEN, "verdict"] == "broken" and mine.at[BROKEN, "leaked"] == "2"


def _forge_holds(folder: Path) -> None:
    """The broken configuration's leaderboard rows made to say it holds, with nothing leaked."""
    board = _table(folder, "leaderboard.csv")
    mine = board["defense_params"] == BROKEN
    board.loc[mine, ["verdict", "leaked_rate", "suite_leaked"]] = ["holds", "0.0", "0"]
    _put(board, folder, "leaderboard.csv")


def _labels(folder: Path) -> set[str]:
    """The configurations of the copy's leaderboard as the board and its ledger name them."""
    board = _table(folder, "leaderboard.csv")
    pairs = zip(board["defense"], board["defense_params"], strict=True)
    return {defense_label(defense, params) for defense, params in pairs}


def _claim_verified(folder: Path, **extra: object) -> None:
    """A hand-written verification.json saying every configuration is verified."""
    labels = _labels(folder)
    claim = {
        "status": "verified",
        "engine_version": json.loads((folder / "environment.json").read_text())["engine_version"],
        "configurations": {label: "verified" for label in labels},
        **extra,
    }
    (folder / "verification.json").write_text(json.dumps(claim))


def test_an_edited_leaderboard_is_apart_with_the_difference_it_makes(
    honest: Path, tmp_path: Path
) -> None:
    forged = _copy(honest, tmp_path / "forged")
    _forge_holds(forged)
    _claim_verified(forged)
    site = tmp_path / "site"
    result = _board(honest, forged, out=site)
    _assert_honest_stands(result, site, honest)
    _assert_apart(
        result, site, forged, "leaderboard.csv says leaked_rate = 0.0 where its trials give 1.0"
    )
    rows = _rows(site)
    assert "holds" not in set(rows["verdict"])
    assert not rows["verification"].str.startswith("verified").any()


def test_a_hand_written_verification_is_shown_as_claimed_never_as_verified(
    honest: Path, tmp_path: Path
) -> None:
    claimed = _copy(honest, tmp_path / "claimed")
    _claim_verified(claimed)
    site = tmp_path / "site"
    result = _board(honest, claimed, out=site)
    _assert_honest_stands(result, site, claimed)  # its numbers are the honest ones
    rows = _rows(site)
    mine = rows[rows["run_dir"] == str(claimed)]
    assert set(mine["verification"]) == {"not verified (claims verified)"}
    assert set(rows[rows["run_dir"] == str(honest)]["verification"]) == {"not verified"}


def _ledger_record(folder: Path) -> dict[str, object]:
    """A ledger record verifying every configuration of ``folder`` at its own engine."""
    labels = _labels(folder)
    return {
        "status": "verified",
        "engine_version": json.loads((folder / "environment.json").read_text())["engine_version"],
        "entry_sha256": entry_sha256(folder),
        "configurations": {label: {"status": "verified"} for label in labels},
    }


def test_a_verification_keyed_by_the_entry_s_own_hash_is_still_not_verified(
    honest: Path, tmp_path: Path
) -> None:
    # Everything a submitter can compute: the ledger's hash of its files, the tables' hash, a
    # ledger-shaped verifications.json beside them. None of it is the board's ledger.
    keyed = _copy(honest, tmp_path / "keyed")
    record = _ledger_record(keyed)
    digest = hashlib.sha256()
    for name in ("trials.csv", "leaderboard.csv"):
        digest.update((keyed / name).read_bytes())
    _claim_verified(
        keyed,
        entry_sha256=record["entry_sha256"],
        tables_sha256=digest.hexdigest(),
        configurations=record["configurations"],
    )
    ledger = {"ledger": LEDGER_FORMAT, "records": {str(record["entry_sha256"]): record}}
    (keyed / LEDGER_FILE).write_text(json.dumps(ledger))
    site = tmp_path / "site"
    result = _board(keyed, out=site)
    _assert_honest_stands(result, site, keyed)
    assert set(_rows(site)["verification"]) == {"not verified (claims verified)"}

    # The control: the same record in the board's own ledger verifies the entry, and only the
    # bytes it hashed: trials edited after the record find no record, and a forged leaderboard
    # (not hashed: the board recomputes it) is apart.
    board_ledger = tmp_path / "ledger.json"
    board_ledger.write_text(json.dumps(ledger))
    vouched = tmp_path / "vouched"
    edited = _copy(keyed, tmp_path / "edited")
    trials = _table(edited, "trials.csv")
    trials.loc[0, "seconds"] = "1.5"  # not a score: the entry stands, under another hash
    _put(trials, edited, "trials.csv")
    forged = _copy(keyed, tmp_path / "forged")
    _forge_holds(forged)
    result = _board(keyed, edited, forged, out=vouched, extra=("--ledger", str(board_ledger)))
    assert result.code == 0, result.err
    rows = _rows(vouched)
    assert set(rows[rows["run_dir"] == str(keyed)]["verification"]) == {"verified"}
    assert set(rows[rows["run_dir"] == str(edited)]["verification"]) == {
        "not verified (claims verified)"
    }
    _assert_apart(result, vouched, forged, "leaderboard.csv says")


# (name, leaderboard edit on the broken configuration's rows, a fragment of the reason)
NUMBER_FORGERIES: list[Any] = [
    ("negative-count", {"suite_leaked": "-3"}, "is not a count between 0 and"),
    ("over-claimed-n", {"suite_n": "1000", "n": "1000"}, "leaderboard.csv says n = 1000"),
    ("infinite-interval", {"suite_high": "inf"}, "suite_high"),
    ("nan-interval", {"suite_high": "nan"}, "suite_high"),
    ("unknown-verdict", {"verdict": "unbreakable"}, "'unbreakable' is not one of"),
]


@pytest.mark.parametrize("case", NUMBER_FORGERIES, ids=lambda case: case[0])
def test_numbers_a_leaderboard_cannot_hold_put_its_entry_apart(
    case: tuple[str, dict[str, str], str], honest: Path, tmp_path: Path
) -> None:
    name, edit, fragment = case
    forged = _copy(honest, tmp_path / name)
    board = _table(forged, "leaderboard.csv")
    mine = board["defense_params"] == BROKEN
    board.loc[mine, list(edit)] = list(edit.values())
    _put(board, forged, "leaderboard.csv")
    board = build_board([forged])
    assert board.rows.empty
    assert list(board.apart["run_dir"]) == [str(forged)]
    reason = board.apart["reason"].iloc[0]
    _assert_one_line(reason)
    assert fragment in reason, reason


def test_trial_scores_edited_and_rescored_without_their_arrays_are_apart(
    honest: Path, tmp_path: Path
) -> None:
    # The consistent forgery: the broken configuration's scores made to look like noise, its
    # flags and leaderboard recomputed from them by `leakbench rescore`; only arrays/ disagree.
    forged = _copy(honest, tmp_path / "forged")
    trials = _table(forged, "trials.csv")
    mine = trials["defense_params"] == BROKEN
    trials.loc[mine, ["mse", "psnr", "ssim", "lpips"]] = ["0.3", "5.228787452803376", "0.1", "0.6"]
    _put(trials, forged, "trials.csv")
    assert run_cli("rescore", str(forged)).code == 0
    board = pd.read_csv(forged / "leaderboard.csv")
    # the leaderboard says what the edited trials say: only arrays/ can tell
    assert board.loc[board["defense_params"] == BROKEN, "psnr_mean"].tolist() == [
        pytest.approx(5.228787452803376)
    ]
    site = tmp_path / "site"
    result = _board(honest, forged, out=site)
    _assert_honest_stands(result, site, honest)
    reason = _assert_apart(result, site, forged, "trials.csv:", "not what arrays/ gives")
    assert "gaussian" in reason and "sigma" in reason


def test_a_defense_its_config_does_not_name_is_apart_even_when_relabelled_consistently(
    honest: Path, tmp_path: Path
) -> None:
    relabelled = _copy(honest, tmp_path / "relabelled")
    _relabel(relabelled, "no-such-defense")
    board = build_board([relabelled])
    assert board.rows.empty and list(board.apart["run_dir"]) == [str(relabelled)]
    assert "which its config.toml does not plan" in board.apart["reason"].iloc[0]


def test_a_config_that_names_a_file_outside_the_data_roots_is_apart_unread(
    honest: Path, tmp_path: Path
) -> None:
    # A submission must not make the board read a file of the builder's machine: a dataset
    # path outside the working directory and the --data-root directories puts it apart first.
    outside = _copy(honest, tmp_path / "outside")
    config = (outside / "config.toml").read_text()
    config = config.replace('dataset = "digits"', 'dataset = "npz:/etc/secret.npz"')
    (outside / "config.toml").write_text(config)
    environment = json.loads((outside / "environment.json").read_text())
    environment["config_sha256"] = hashlib.sha256(config.encode()).hexdigest()
    (outside / "environment.json").write_text(json.dumps(environment))
    for name in ("leaderboard.csv", "trials.csv", "utility.csv"):
        table = _table(outside, name)
        if "dataset" in table:
            table["dataset"] = "npz:/etc/secret.npz"
            _put(table, outside, name)
    board = build_board([outside])
    assert board.rows.empty
    assert "outside the data roots" in board.apart["reason"].iloc[0]


# --- small inputs, large damage ----------------------------------------------------------------


def test_a_huge_provenance_string_does_not_grow_the_board(honest: Path, tmp_path: Path) -> None:
    # Beyond the cap: apart. Within it: standing, and cut to a short cell.
    huge = _copy(honest, tmp_path / "huge")
    environment = json.loads((huge / "environment.json").read_text())
    (huge / "environment.json").write_text(json.dumps({**environment, "python": "x" * 2_000_000}))
    large = _copy(honest, tmp_path / "large")
    (large / "environment.json").write_text(json.dumps({**environment, "python": "y" * 60_000}))
    site = tmp_path / "site"
    result = _board(huge, large, out=site)
    assert result.code == 0, result.err
    _assert_apart(result, site, huge, "environment.json weighs")
    _assert_honest_stands(result, site, large)
    written = sum(path.stat().st_size for path in site.iterdir() if path.is_file())
    assert written < 2_000_000 // 4, written
    with (site / "board.csv").open(newline="") as handle:
        longest = max(len(cell) for row in csv.reader(handle) for cell in row)
    assert longest <= MAX_REASON, longest
    for path in site.iterdir():  # the provenance field is cut to a short cell everywhere
        assert "y" * 100 not in path.read_text(), path.name


def _link_variants(honest: Path, root: Path) -> dict[str, Path]:
    """Submissions that hold (or are) a symbolic link, or a FIFO."""
    real = _copy(honest, root / "real")
    linked = root / "linked"
    linked.symlink_to(real, target_is_directory=True)
    loop = _copy(honest, root / "loop")
    (loop / "loop").symlink_to(".", target_is_directory=True)
    outside = root / "outside.json"
    outside.write_text(json.dumps({"python": "the builder's secret", "commit": "secret"}))
    leaking = _copy(honest, root / "leaking")
    (leaking / "environment.json").unlink()
    (leaking / "environment.json").symlink_to(outside)
    fifo = _copy(honest, root / "fifo")
    os.mkfifo(fifo / "pipe")
    return {"linked": linked, "loop": loop, "leaking": leaking, "fifo": fifo}


def test_links_and_special_files_put_a_submission_apart(honest: Path, tmp_path: Path) -> None:
    variants = _link_variants(honest, tmp_path)
    site = tmp_path / "site"
    result = _board(honest, *variants.values(), out=site)
    _assert_honest_stands(result, site, honest)
    for name in ("linked", "loop", "leaking"):
        _assert_apart(result, site, variants[name], "symbolic link")
    _assert_apart(result, site, variants["fifo"], "pipe", "not a regular file")
    for page in ("board.csv", "board.html", "index.md"):
        assert "secret" not in (site / page).read_text()


def test_a_name_with_a_line_break_is_apart_and_breaks_no_line(honest: Path, tmp_path: Path) -> None:
    # A name that would forge a line of the output, and break out of index.md's code block.
    named = _copy(honest, tmp_path / "sub\nshown apart: forged\n```\n<img src=x onerror=alert(1)>")
    site = tmp_path / "site"
    result = _board(honest, named, out=site)
    _assert_honest_stands(result, site, honest)
    shown = str(named).replace("\n", " ")
    assert list(_apart(site)) == [shown]  # apart.csv names it without its line breaks
    reason = _apart(site)[shown]
    _assert_one_line(reason)
    assert "control characters" in reason
    assert result.out.splitlines()[0] == f"shown apart: {shown}: {reason}"
    assert len(result.out.strip().splitlines()) == 2, result.out
    page = (site / "index.md").read_text()
    assert "<img src=x" not in page and "\n```\n<img" not in page


def _formula_cells(path: Path) -> list[str]:
    """The cells of a CSV that a spreadsheet would run as a formula."""
    with path.open(newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    return [c for c in cells if c.startswith(FORMULA_STARTS) and not _is_number(c)]


def _is_number(text: str) -> bool:
    try:
        return not math.isnan(float(text)) or text.lower() == "nan"
    except ValueError:
        return False


def test_formula_cells_never_start_a_cell_of_the_board_s_csvs(
    honest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the board records run directories relative to here
    # A name that is a formula (the entry stands), a formula in a note the board recomputes
    # (stands), in a defense name only the leaderboard holds (apart), and in a defense name its
    # trials and leaderboard hold alike (apart: its config plans no such defense).
    named = _copy(honest, tmp_path / '=HYPERLINK("x?"&A2,"x")')
    noted = _copy(honest, tmp_path / "@SUM(1+1)")
    _put(_table(noted, "leaderboard.csv").assign(verdict_note="=1+1"), noted, "leaderboard.csv")
    claimed = _copy(honest, tmp_path / "+claimed")
    _cell("leaderboard.csv", "defense", "=cmd|' /C calc'!A0")(claimed)
    renamed = _copy(honest, tmp_path / "-renamed")
    _relabel(renamed, "@SUM(A1:A9)")
    names = [p.name for p in (named, noted, claimed, renamed)]
    result = run_cli("board", "--out", "site", "--quiet", "--", str(honest), *names)
    assert result.code == 0, result.err
    site = tmp_path / "site"
    rows = _rows(site)
    assert (rows["run_dir"] == str(honest)).sum() == CONFIGURATIONS
    assert set(pd.read_csv(site / "apart.csv", dtype=str)["run_dir"]) == {"'+claimed", "'-renamed"}
    assert "=1+1" not in set(rows["verdict_note"]) and "'=1+1" not in set(rows["verdict_note"])
    for table in ("board.csv", "apart.csv"):
        assert _formula_cells(site / table) == [], (
            f"{table} starts cells with a formula: the neutralisation in write_board "
            "(leakbench.outputs.board_html._formula_safe) is missing or incomplete"
        )
    written = (site / "board.csv").read_text() + (site / "apart.csv").read_text()
    assert "'=HYPERLINK(" in written and "'@SUM(1+1)" in written


# --- --verify ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["linked", "loop", "leaking"])
def test_verify_refuses_a_linked_submission_in_one_line_before_copying(
    variant: str, honest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import leakbench.run.submission as submission

    copied: list[str] = []
    real_copy = shutil.copyfile

    def recording_copy(source: Any, target: Any, **kwargs: Any) -> Any:
        copied.append(str(source))
        return real_copy(source, target, **kwargs)

    sub = _link_variants(honest, tmp_path)[variant]
    monkeypatch.setattr(submission.shutil, "copyfile", recording_copy)
    ledger = tmp_path / "ledger.json"
    result = run_cli("board", "--verify", str(sub), "--ledger", str(ledger))
    assert result.code == 2, (result.code, result.err)
    line = result.err.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("leakbench: error") and "symbolic link" in line, line
    assert copied == [] and not ledger.exists()
