"""`leakbench board`: the cross-run board from two tiny runs of different datasets, its rows,
intervals and tables, the refusal of a tampered folder and of bad input, and `--verify` on a
run and on a copy whose numbers were edited."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_capture import run_cli
from scipy.stats import t as student_t

from leakbench.components.leakage import exact_interval
from leakbench.core.environment import describe_commit
from leakbench.core.versions import ENGINE_VERSION, UNVERSIONED, weak_evaluation
from leakbench.datasets import load_dataset
from leakbench.outputs.board import BOARD_COLUMNS, commit_text, config_sha256, dataset_name
from leakbench.outputs.board_html import board_page
from leakbench.run.board_build import build_board, natural_key
from leakbench.run.ledger import HASHED, entry_sha256, read_ledger
from leakbench.run.verify import Sample, committed_keys, rerun_sample

DEFAULT_RUN = Path(__file__).resolve().parents[1] / "results" / "default"

# Both runs attack with the same idlg, so its program compiles once for the file.
RUN = """\
name = "{name}"
dataset = "{dataset}"
model = "lenet"
suite = "listed"
images = 2
seeds = [0, 1]

[[attack]]
name = "idlg"
iterations = 5

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [1e-3, 1e-1]

[training]
{training}
"""
TRAINING = "epochs = 1\nbatch_size = 64\nlearning_rates = [0.01]\nseeds = 1\n"


def _inverted_digits(path: Path) -> str:
    """A second dataset: the digits in negative (real images, another dataset's name)."""
    data = load_dataset("digits")
    to_byte = lambda x: np.round(255 * (1 - x[..., 0])).astype(np.uint8)  # noqa: E731
    np.savez(
        path,
        x=to_byte(data.train.x),
        y=data.train.y,
        x_test=to_byte(data.test.x),
        y_test=data.test.y,
    )
    return f"npz:{path}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("board")
    made = []
    for name, dataset, training in (
        ("digits-run", "digits", TRAINING),
        ("negative-run", _inverted_digits(root / "negative-digits.npz"), "enabled = false"),
    ):
        config = root / f"{name}.toml"
        config.write_text(RUN.format(name=name, dataset=dataset, training=training))
        result = run_cli("run", str(config), "--out", str(root / name), "--quiet")
        assert result.code == 0, result.err
        made.append(root / name)
    return made[0], made[1]


def _data(runs: tuple[Path, Path]) -> list[str]:
    """The --data-root the board needs to read the negative digits beside the runs."""
    return ["--data-root", str(runs[0].parent)]


@pytest.fixture(scope="module")
def board(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = run_cli("board", *map(str, runs), "--out", str(out), *_data(runs))
    assert result.code == 0, result.err
    return out


def test_the_run_records_its_config_hash(runs: tuple[Path, Path]) -> None:
    for run in runs:
        recorded = json.loads((run / "environment.json").read_text())["config_sha256"]
        assert recorded == config_sha256((run / "config.toml").read_text())


def test_one_row_per_defense_setting_in_one_table_per_dataset(board: Path) -> None:
    rows = pd.read_csv(board / "board.csv")
    assert list(rows.columns) == BOARD_COLUMNS
    # 2 runs x (none, gaussian 1e-3, gaussian 1e-1)
    assert len(rows) == 6
    assert set(rows["dataset"].map(dataset_name)) == {"digits", "negative-digits"}
    assert rows["table"].nunique() == 2
    for _, table in rows.groupby("table"):
        assert sorted(table["defense_label"]) == [
            "gaussian sigma=0.001",
            "gaussian sigma=0.1",
            "none",
        ]
    assert set(rows["threat_model"]) == {"honest server, batch 1"}
    assert set(rows["config_hash"]) == {"matches the recorded hash"}
    assert set(rows["verification"]) == {"not verified"}
    assert (board / "board.html").is_file() and (board / "index.md").is_file()
    assert pd.read_csv(board / "apart.csv").empty


def test_leaked_share_and_its_exact_interval(board: Path, runs: tuple[Path, Path]) -> None:
    rows = pd.read_csv(board / "board.csv")
    for run in runs:
        trials = pd.read_csv(run / "trials.csv")
        for defense, params in trials[["defense", "defense_params"]].drop_duplicates().to_numpy():
            mine = trials[(trials["defense"] == defense) & (trials["defense_params"] == params)]
            # one attack, so the suite union is that attack's per-image leak flags
            k, n = int(mine["leaked"].sum()), len(mine)
            row = rows[(rows["run_dir"].str.endswith(run.name)) & (rows["defense"] == defense)
                       & (rows["defense_params"] == params)].iloc[0]  # fmt: skip
            assert (row["leaked"], row["n"]) == (k, n) == (row["leaked"], 4)
            assert row["leaked_share"] == pytest.approx(k / n)
            low, high = exact_interval(k, n)
            assert row["leaked_low"] == pytest.approx(low)
            assert row["leaked_high"] == pytest.approx(high)
            assert row["strongest_attack"].startswith("idlg")


def test_accuracy_cost_is_paired_by_seed_with_its_interval(board, runs) -> None:
    rows = pd.read_csv(board / "board.csv")
    utility = pd.read_csv(runs[0] / "utility.csv")
    by = utility.set_index(["defense", "defense_params", "seed"])["test_accuracy"]
    row = rows[(rows["dataset"] == "digits") & (rows["defense_params"] == '{"sigma":0.1}')]
    d0 = by[("none", "{}", 0)] - by[("gaussian", '{"sigma":0.1}', 0)]
    d1 = by[("none", "{}", 1)] - by[("gaussian", '{"sigma":0.1}', 1)]
    assert row["accuracy_drop"].iloc[0] == pytest.approx((d0 + d1) / 2)
    # two differences: sd = |d0 - d1| / sqrt(2), half-width = t(0.975, 1) * sd / sqrt(2)
    half = student_t.ppf(0.975, 1) * abs(d0 - d1) / 2
    assert row["accuracy_drop_ci95"].iloc[0] == pytest.approx(half)
    undefended = rows[(rows["dataset"] == "digits") & (rows["defense"] == "none")]
    assert undefended["accuracy_drop"].iloc[0] == 0.0
    # the run without training has no accuracy
    assert rows[rows["dataset"] != "digits"]["test_accuracy"].isna().all()


def test_the_page_cuts_an_accuracy_interval_at_what_accuracy_can_be(runs) -> None:
    # Two seeds far apart give a t interval wider than the scale: shown cut at 0% and 100%
    # (and the accuracy cost at -100% and 100%); a narrow one is shown as it is.
    board = build_board([runs[0]])
    rows = board.rows
    wide = rows.index[rows["defense_params"] == '{"sigma":0.1}'][0]
    narrow = rows.index[rows["defense_params"] == '{"sigma":0.001}'][0]
    rows.loc[wide, ["test_accuracy", "test_accuracy_ci95"]] = [0.505, 4.785]
    rows.loc[wide, ["accuracy_drop", "accuracy_drop_ci95"]] = [0.386, 4.961]
    rows.loc[narrow, ["test_accuracy", "test_accuracy_ci95"]] = [0.9, 0.05]
    page = board_page(board)
    assert "accuracy 50.5% [0.0%–100.0%]" in page
    assert ">38.6% [-100.0%–100.0%]<" in page
    assert "accuracy 90.0% [85.0%–95.0%]" in page
    assert "±" not in page


def test_a_tampered_config_is_shown_apart(runs, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(runs[1], tampered)
    config = tampered / "config.toml"
    config.write_text(config.read_text().replace("images = 2", "images = 3"))
    out = tmp_path / "site"
    result = run_cli("board", str(runs[0]), str(tampered), "--out", str(out), *_data(runs))
    assert result.code == 0, result.err
    assert "shown apart" in result.out and "does not match the hash" in result.out
    apart = pd.read_csv(out / "apart.csv")
    assert len(apart) == 1 and apart["run_dir"].iloc[0].endswith("tampered")
    rows = pd.read_csv(out / "board.csv")
    assert not rows["run_dir"].str.endswith("tampered").any() and len(rows) == 3
    assert "does not match the hash" in (out / "board.html").read_text()


@pytest.mark.parametrize("case", ["no folders", "no out"])
def test_bad_input_is_one_line_and_exit_2(case: str, runs, tmp_path: Path) -> None:
    argv = [] if case == "no folders" else [str(runs[0])]
    out = tmp_path / "site"
    result = run_cli("board", *argv, *([] if case == "no out" else ["--out", str(out)]))
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1 and result.err.startswith("leakbench: error")
    assert not out.exists()


@pytest.mark.parametrize("case", ["no leaderboard", "mixed protocols"])
def test_an_entry_that_cannot_stand_is_apart_and_the_board_is_built(
    case: str, runs, tmp_path: Path
) -> None:
    folder = tmp_path / "run"
    shutil.copytree(runs[0], folder)
    if case == "no leaderboard":
        (folder / "leaderboard.csv").unlink()
    else:
        board = pd.read_csv(folder / "leaderboard.csv")
        board.loc[0, "protocol"] = 1  # the run lists its attacks: its rows say protocol 0
        board.to_csv(folder / "leaderboard.csv", index=False)
    out = tmp_path / "site"
    result = run_cli("board", str(runs[1]), str(folder), "--out", str(out), "--quiet", *_data(runs))
    assert result.code == 0, result.err
    apart = pd.read_csv(out / "apart.csv")
    reason = {"no leaderboard": "no leaderboard.csv", "mixed protocols": "mixes protocol"}[case]
    assert list(apart["run_dir"]) == [str(folder)] and reason in apart["reason"].iloc[0]
    assert f"shown apart: {folder}: " in result.out
    assert len(pd.read_csv(out / "board.csv")) == 3  # the other entry's rows


def test_verify_a_run_and_dispute_an_edited_copy(runs, tmp_path: Path) -> None:
    honest = tmp_path / "honest"
    shutil.copytree(runs[1], honest)
    ledger = tmp_path / "ledger.json"
    result = run_cli(
        "board", "--verify", str(honest), "--share", "1", "--ledger", str(ledger), *_data(runs)
    )
    assert result.code == 0, result.err
    assert " trials: 100%" in result.err  # the rerun's progress bar, on stderr
    assert not (honest / "verification.json").exists()  # never written into the submission
    record = read_ledger(ledger)[entry_sha256(honest)]
    assert record["engine_version"] == ENGINE_VERSION
    assert record["status"] == "verified", record
    assert record["compared"] == 12 and record["disagreements"] == []
    assert {v["status"] for v in record["configurations"].values()} == {"verified"}
    assert sum(v["compared"] for v in record["configurations"].values()) == 12

    # Scores edited with their arrays left alone: the board's own check against the arrays
    # puts the entry apart, and --verify disputes it.
    edited = tmp_path / "edited"
    shutil.copytree(runs[1], edited)
    trials = pd.read_csv(edited / "trials.csv")
    strong = trials["defense_params"] == '{"sigma":0.1}'
    trials.loc[strong, "psnr"] = trials.loc[strong, "psnr"] + 20.0  # a better defense's numbers
    trials.to_csv(edited / "trials.csv", index=False)
    result = run_cli("board", "--verify", str(edited), "--share", "1", "--quiet", "--ledger",
                     str(ledger), *_data(runs))  # fmt: skip
    assert result.code == 0 and "%|" not in result.err, result.err  # no progress bar
    record = read_ledger(ledger)[entry_sha256(edited)]
    assert record["status"] == "disputed"
    assert "not what arrays/ gives" in record["problems"][0]
    assert len(record["disagreements"]) == int(strong.sum()) == 4
    site = tmp_path / "site"
    result = run_cli(
        "board", str(honest), str(edited), "--out", str(site), "--ledger", str(ledger), *_data(runs)
    )
    assert result.code == 0, result.err
    rows = pd.read_csv(site / "board.csv")
    assert set(rows[rows["run_dir"].str.endswith("honest")]["verification"]) == {"verified"}
    assert not rows["run_dir"].str.endswith("edited").any()
    assert "not what arrays/ gives" in pd.read_csv(site / "apart.csv")["reason"].iloc[0]
    _a_verification_vouches_only_for_what_it_checked(honest, ledger, tmp_path)


def _a_verification_vouches_only_for_what_it_checked(
    verified: Path, ledger: Path, tmp_path: Path
) -> None:
    # Files changed after the verification, or the run made again by another engine: the
    # ledger's record does not speak for the numbers, and the board says "not verified". A
    # record the submission writes itself is never believed.
    records = read_ledger(ledger)
    changed = tmp_path / "changed"
    shutil.copytree(verified, changed)
    # A byte the numbers come from, changed (a blank line pandas reads past): another entry.
    (changed / "config.toml").write_bytes((changed / "config.toml").read_bytes() + b"\n")
    environment = json.loads((changed / "environment.json").read_text())
    environment["config_sha256"] = config_sha256((changed / "config.toml").read_text())
    (changed / "environment.json").write_text(json.dumps(environment))
    rerun = _copy_of_engine(verified, tmp_path / "rerun", ENGINE_VERSION + 1)
    claimed = tmp_path / "claimed"
    shutil.copytree(changed, claimed)
    labels = pd.read_csv(claimed / "leaderboard.csv")["defense"]
    (claimed / "verification.json").write_text(
        json.dumps({"status": "verified", "configurations": dict.fromkeys(labels, "verified")})
    )
    # The same bytes with Windows line endings, or in another folder, are the same entry.
    crlf = tmp_path / "crlf"
    shutil.copytree(verified, crlf)
    for name in HASHED:
        if (crlf / name).is_file():
            text = (crlf / name).read_bytes()
            (crlf / name).write_bytes(text.replace(b"\n", b"\r\n"))
    expected = {"changed": "not verified", "rerun": f"not verified (verified at engine "
                f"{ENGINE_VERSION})", "claimed": "not verified (claims verified)",
                "crlf": "verified", "honest": "verified"}  # fmt: skip
    rows = build_board(
        [changed, rerun, claimed, crlf, verified], ledger=records, data_roots=[ledger.parent.parent]
    ).rows
    for folder, status in expected.items():
        assert set(rows[rows["run_dir"].str.endswith(folder)]["verification"]) == {status}


def test_an_edited_leaderboard_is_apart_and_disputed(runs, tmp_path: Path) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(runs[1], edited)
    board = pd.read_csv(edited / "leaderboard.csv")
    board["suite_leaked"] = board["suite_leaked"] + 1  # one more image leaked than it did
    board.to_csv(edited / "leaderboard.csv", index=False)
    assert (
        "says suite_leaked = "
        in build_board([edited], data_roots=[runs[1].parent]).apart["reason"].iloc[0]
    )
    ledger = tmp_path / "ledger.json"
    result = run_cli(
        "board", "--verify", str(edited), "--share", "1", "--ledger", str(ledger), *_data(runs)
    )
    assert result.code == 0, result.err
    record = read_ledger(ledger)[entry_sha256(edited)]
    assert record["status"] == "disputed"
    assert len(record["problems"]) == 1 and "suite_leaked" in record["problems"][0]
    assert record["disagreements"] == []  # the trials themselves were not edited
    assert {v["status"] for v in record["configurations"].values()} == {"disputed"}


def test_every_configuration_and_attack_setting_is_drawn_whatever_the_seed(runs) -> None:
    # The draw is stratified: with the smallest share, each seed still reruns a group of
    # every (attack setting, defense configuration) cell the committed trials hold.
    from leakbench.datasets import load_dataset as load
    from leakbench.run.config import load_config
    from leakbench.run.plan import attack_groups, plan

    spec = load_config(runs[0] / "config.toml")
    groups = attack_groups(plan(spec, load(spec.dataset)), 1)
    committed = pd.read_csv(runs[0] / "trials.csv")
    cells = set(committed_keys(committed))
    drawn = []
    for draw in range(20):
        sample = Sample(1, 2, committed=frozenset(cells), share=0.01, draw=draw)
        taken = sample.take(groups)
        covered = {k[:4] for g in taken for t in g for k in [_key(t)]}
        assert covered == {k[:4] for k in cells}
        drawn.append(tuple(id(g) for g in taken))
    assert len(set(drawn)) > 1  # the draw depends on the seed


def _key(trial: object) -> tuple:
    from leakbench.run.verify import _trial_key

    return _trial_key(trial)


def test_model_states_sort_by_the_numbers_in_them() -> None:
    states = ["checkpoint epoch-10", "checkpoint epoch-2", "checkpoint epoch-1", "initialisation"]
    assert sorted(states, key=natural_key) == [
        "checkpoint epoch-1", "checkpoint epoch-2", "checkpoint epoch-10", "initialisation",
    ]  # fmt: skip


def test_a_text_run_has_a_row_per_batch_size_and_defense() -> None:
    # A text run judges each batch size apart; the committed quick run attacks B = 1 and 4.
    folder = Path(__file__).resolve().parents[1] / "results" / "text" / "quick"
    board = build_board([folder]).rows
    leaderboard = pd.read_csv(folder / "leaderboard.csv")
    cells = leaderboard[["batch_size", "defense", "defense_params"]].drop_duplicates()
    assert len(board) == len(cells) and sorted(set(board["batch_size"])) == [1, 4]
    for _, row in board.iterrows():
        same = leaderboard[
            (leaderboard["batch_size"] == row["batch_size"])
            & (leaderboard["defense"] == row["defense"])
            & (leaderboard["defense_params"] == row["defense_params"])
        ]
        assert row["verdict"] == same["verdict"].iloc[0]
        assert row["leaked"] == same["suite_leaked"].iloc[0]
        assert f"batch {row['batch_size']}" in row["threat_model"]


def test_a_text_run_s_row_carries_its_perplexity_as_the_utility() -> None:
    # Text leaderboards carry the language model's perplexity, not an accuracy: the board's
    # row keeps it, and the page names it in the utility column.
    folder = Path(__file__).resolve().parents[1] / "results" / "text" / "quick"
    board = build_board([folder])
    leaderboard = pd.read_csv(folder / "leaderboard.csv")
    for _, row in board.rows.iterrows():
        same = leaderboard[
            (leaderboard["batch_size"] == row["batch_size"])
            & (leaderboard["defense"] == row["defense"])
            & (leaderboard["defense_params"] == row["defense_params"])
        ]
        assert row["perplexity"] == pytest.approx(float(same["perplexity"].iloc[0]))
        assert np.isnan(row["test_accuracy"])
    page = board_page(board)
    first = float(board.rows["perplexity"].iloc[0])
    assert f'data-label="utility" data-sort="{-first!r}">perplexity {first:.1f}</td>' in page
    assert 'data-label="utility" data-sort="">accuracy' not in page


def test_the_commit_shows_with_a_dirty_checkout_marked() -> None:
    assert commit_text({}) == "not recorded"
    assert commit_text({"commit": "not recorded"}) == "not recorded"
    assert commit_text({"commit": "ab12", "dirty": False}) == "ab12"
    assert commit_text({"commit": "ab12", "dirty": True}) == "ab12 (uncommitted changes)"


def test_a_run_s_recorded_commit_reaches_its_board_row(runs, tmp_path: Path) -> None:
    # `leakbench run` records the commit of the checkout leakbench was imported from.
    environment = json.loads((runs[0] / "environment.json").read_text())
    assert environment["commit"] == describe_commit()["commit"]
    folder = tmp_path / "copy"
    shutil.copytree(runs[0], folder)
    environment.update(commit="0123456789abcdef0123456789abcdef01234567", dirty=False)
    (folder / "environment.json").write_text(json.dumps(environment))
    rows = build_board([folder]).rows
    assert set(rows["commit"]) == {"0123456789abcdef0123456789abcdef01234567"}
    assert "commit 0123456789abcdef0123456789abcdef01234567" in board_page(build_board([folder]))


def _copy_of_engine(run: Path, folder: Path, engine: int) -> Path:
    """A copy of ``run`` whose environment.json says another engine version made it."""
    shutil.copytree(run, folder)
    environment = json.loads((folder / "environment.json").read_text())
    environment["engine_version"] = engine
    (folder / "environment.json").write_text(json.dumps(environment))
    return folder


def test_a_run_of_an_engine_before_a_stronger_attack_is_flagged_and_unranked(
    tmp_path: Path,
) -> None:
    # The committed default run follows the suite, so its run ranks its defenses (the runs of
    # this file list their attacks and rank nothing).
    fresh_dir = tmp_path / "fresh"
    shutil.copytree(DEFAULT_RUN, fresh_dir)
    old = _copy_of_engine(fresh_dir, tmp_path / "old", 7)
    rows = build_board([fresh_dir, old]).rows
    fresh, flagged = rows[rows["run_dir"] == str(fresh_dir)], rows[rows["run_dir"] == str(old)]
    assert set(fresh["weak_evaluation"]) == {""}
    assert len(flagged) == 19 and flagged["table_rank"].isna().all()
    assert flagged["weak_evaluation"].str.startswith("engine 7: its cosine matching loss").all()
    # The copy's rows are ranked by its run as the fresh run's are, but not on the board.
    by_defense = [frame.sort_values(["defense", "defense_params"])["run_rank"].fillna(-1).tolist()
                  for frame in (flagged, fresh)]  # fmt: skip
    assert by_defense[0] == by_defense[1]
    assert fresh["run_rank"].notna().any()
    assert fresh["table_rank"].notna().sum() == fresh["run_rank"].notna().sum()
    assert "weak evaluation (engine 7)" in board_page(build_board([old]))
    assert "weak evaluation" not in board_page(build_board([fresh_dir])).split("<table", 1)[1]


def test_verify_refuses_a_run_of_another_engine(runs, tmp_path: Path) -> None:
    old = _copy_of_engine(runs[0], tmp_path / "old", ENGINE_VERSION - 1)
    ledger = tmp_path / "ledger.json"
    result = run_cli("board", "--verify", str(old), "--ledger", str(ledger))
    assert result.code == 2 and not ledger.exists()
    line = result.err.strip()
    assert "\n" not in line and f"made by engine {ENGINE_VERSION - 1}" in line
    assert "rerun the entry" in line


def test_weak_evaluation_names_the_fixes_an_engine_predates() -> None:
    assert weak_evaluation(ENGINE_VERSION) == ""
    assert "cosine" in weak_evaluation(7) and weak_evaluation("7") == weak_evaluation(7)
    assert "judge" not in weak_evaluation(7)
    # An engine before the standard suite and its judge lacks both fixes.
    five = weak_evaluation(5).split("; ")
    assert len(five) == 2 and "judge of engine 6" in five[0] and "cosine" in five[1]
    # An engine that was not recorded is the oldest.
    assert weak_evaluation("") == weak_evaluation(UNVERSIONED) != ""


def test_verify_reruns_a_trained_model_with_the_run_s_recipe(tmp_path: Path) -> None:
    """A run attacking a model trained for ``train_steps`` with its own ``[training]`` recipe:
    the rerun trains the attacked model with that recipe, not the default one, so every
    rerun image has its committed numbers exactly (same machine, same process)."""
    recipe = 'epochs = 1\nbatch_size = 16\noptimizer = "sgd"\nlearning_rates = [0.5]\nseeds = 1\n'
    text = RUN.format(name="trained", dataset="digits", training=recipe)
    config = tmp_path / "trained.toml"
    config.write_text(text + "\n[threat_model]\ntrain_steps = 20\n")
    run = tmp_path / "trained"
    assert run_cli("run", str(config), "--out", str(run), "--quiet").code == 0
    committed = pd.read_csv(run / "trials.csv")
    sample = Sample(1, 2, committed=committed_keys(committed), share=1.0, draw=0)
    rerun = rerun_sample(run, tmp_path / "scratch", sample)
    keys = ["attack", "defense", "defense_params", "seed", "batch_index", "position"]
    joined = rerun.merge(committed, on=keys, suffixes=("", "_committed"))
    assert len(joined) == len(committed) == 12, sample
    assert np.array_equal(joined["psnr"], joined["psnr_committed"])
    utility = tmp_path / "scratch" / "rerun" / "utility.csv"
    assert pd.read_csv(utility).empty  # no utility model was trained for the rerun
