"""Verdicts from per-image leakage (`leakbench.components.leakage`,
`leakbench.outputs.tables.rank_defenses`), the identification test, and each defense's adaptive
attacks in the plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leakbench.attacks.suite import PROTOCOL
from leakbench.components.leakage import (
    DISTRACTORS,
    RECOGNISABLE_PSNR,
    beyond_chance,
    chance,
    distractor_pool,
    exact_interval,
    identified,
    recognisable,
)
from leakbench.core.seeds import distractor_indices
from leakbench.datasets import load_dataset
from leakbench.datasets.base import Dataset, Split
from leakbench.defenses import make_defense
from leakbench.outputs.tables import leaderboard
from leakbench.run.config import adaptive_variants, load_config, parse_config
from leakbench.run.plan import plan
from leakbench.run.runner import run_benchmark

ROOT = Path(__file__).resolve().parents[1]
IDLG = json.dumps({"match": "all"})
KEPT = json.dumps({"match": "kept"})


def trial_rows(defense: str, psnrs: list[float], attack_params: str = IDLG, **extra) -> list:
    """Image rows of one cell: one per PSNR (MSE from it), LPIPS unknown, not identified; the
    images alternate between two model seeds (protocol 2's `holds` needs two)."""
    return [
        {
            "run": "r", "dataset": "d", "model": "m", "attack": "idlg",
            "attack_params": attack_params, "defense": defense,
            "defense_params": extra.get("defense_params", "{}"), "seed": i % 2, "batch_index": i,
            "position": 0, "image_index": i, "batch_size": 1, "label": 0, "predicted_label": 0,
            "mse": 10 ** (-p / 10), "psnr": p, "ssim": np.nan, "lpips": np.nan, "label_acc": 1.0,
            "status": "ok", "seconds": 1.0, "identified": extra.get("identified", 0.0),
            "distractors": 999.0,
        }
        for i, p in enumerate(psnrs)
    ]  # fmt: skip


def board_of(*cells: list, protocol: int = PROTOCOL) -> pd.DataFrame:
    return leaderboard(
        pd.DataFrame([row for cell in cells for row in cell]), 1e-3, protocol=protocol
    )


def heads(board: pd.DataFrame) -> pd.DataFrame:
    return board[board["strongest"]].set_index("defense")


def test_mean_psnr_and_per_image_rules_disagree_by_hand() -> None:
    """A leaks half its images at 23-26 dB (recognisable, none exact) and fails on the rest
    (5 dB): mean 14.8 dB, no image recovered, so the old rule said ``holds``. B reconstructs
    every image at 19 dB, above A's mean, and leaks none."""
    board = board_of(
        trial_rows("none", [100.0] * 8),
        trial_rows("A", [23.0, 24.0, 25.0, 26.0, 5.0, 5.0, 5.0, 5.0]),
        trial_rows("B", [19.0] * 36),  # 36 images: enough for a holds (upper bound < 10%)
    )
    top = heads(board)
    assert top.loc["A", "psnr_mean"] < top.loc["B", "psnr_mean"] < 20.0
    assert top.loc["A", "success_rate"] == top.loc["B", "success_rate"] == 0.0
    assert top.loc["A", "recognisable_rate"] == 0.5 and top.loc["A", "leaked_rate"] == 0.5
    # 4 of 8: the exact (Clopper-Pearson) 95% interval, 15.7-84.3%.
    assert top.loc["A", "leaked_low"] == pytest.approx(0.1570, abs=1e-4)
    assert top.loc["A", "leaked_high"] == pytest.approx(0.8430, abs=1e-4)
    assert top.loc["A", "verdict"] == "broken"
    assert top.loc["B", "verdict"] == "holds"
    assert top.loc["none", "verdict"] == "baseline"
    # Ranked by images leaked: B (0 of 36) first, A (4 of 8); none is the unranked baseline.
    assert top["rank"].fillna(0).to_dict() == {"none": 0.0, "A": 2.0, "B": 1.0}
    assert "4/8 leaked over the suite" in top.loc["A", "verdict_note"]


def test_one_leaked_image_is_leaks_and_an_identified_one_counts() -> None:
    many = [5.0] * 39
    board = board_of(
        trial_rows("none", [100.0] * 40),
        trial_rows("C", [RECOGNISABLE_PSNR, *many]),  # 1 of 40 recognisable: 2.5%
        trial_rows("D", [5.0] * 40, identified=1.0),  # noise, but every image identified
        trial_rows("E", [RECOGNISABLE_PSNR - 0.1, *many]),
    )
    top = heads(board)
    assert top.loc["C", "verdict"] == "leaks"
    assert top.loc["D", "verdict"] == "broken" and top.loc["D", "identified_rate"] == 1.0
    assert top.loc["D", "identified_chance"] == pytest.approx(1 / 1000)
    assert top.loc["E", "verdict"] == "holds"


def test_identifications_count_only_beyond_chance() -> None:
    """With 999 distractors, one reconstruction of noise in 36 picked out is what chance gives
    about 3.5% of the time, so it is no leak; two in 36 (p = 6e-4) are. One in 8 (p = 0.008)
    passes the level 0.01 of one cell. Protocol 1 corrected the level for the board's four
    cells (0.0025, Bonferroni), so there it was no leak; protocol 2 corrects for the attacks
    of the defense's own suite, here one (a defense this installation does not know), so it
    is."""
    one_hit = trial_rows("I", [5.0] * 36)
    one_hit[0]["identified"] = 1.0
    two_hits = trial_rows("J", [5.0] * 36)
    two_hits[0]["identified"] = two_hits[1]["identified"] = 1.0
    small = trial_rows("K", [5.0] * 8)
    small[0]["identified"] = 1.0
    rows = (trial_rows("none", [100.0] * 36), one_hit, two_hits, small)
    top = heads(board_of(*rows, protocol=1))
    assert top.loc["I", "identified_rate"] == 1 / 36 and top.loc["I", "leaked_rate"] == 0.0
    assert top.loc["I", "verdict"] == "holds"
    assert top.loc["J", "leaked_rate"] == 2 / 36 and top.loc["J", "verdict"] == "leaks"
    assert top.loc["K", "identified_rate"] == 1 / 8 and top.loc["K", "leaked_rate"] == 0.0
    top = heads(board_of(*rows))
    assert top.loc["I", "leaked_rate"] == 0.0 and top.loc["J", "leaked_rate"] == 2 / 36
    assert top.loc["K", "leaked_rate"] == 1 / 8 and top.loc["K", "verdict"] == "leaks"
    assert beyond_chance(1, 8, 0.001) and not beyond_chance(1, 8, 0.001, alpha=0.01 / 4)
    assert not beyond_chance(1, 11, 0.001) and beyond_chance(1, 10, 0.001)


def test_the_strongest_attack_is_the_one_that_leaks_most_images() -> None:
    """ig leaks 3 of 4 images recognisably; idlg recovers one exactly (higher mean PSNR, higher
    success rate). The defense's headline is ig's row, and its verdict its 3 of 4."""
    board = board_of(
        trial_rows("none", [100.0] * 4),
        trial_rows("F", [100.0, 5.0, 5.0, 5.0]),
        [
            {**row, "attack": "ig", "attack_params": "{}"}
            for row in trial_rows("F", [22.0, 22.0, 22.0, 5.0])
        ],
    )
    f = board[board["defense"] == "F"].set_index("attack")
    assert f.loc["idlg", "psnr_mean"] > f.loc["ig", "psnr_mean"]
    assert f.loc["ig", "strongest"] and not f.loc["idlg", "strongest"]
    assert f.loc["ig", "leaked_rate"] == 0.75


def test_weak_attack_without_a_defense_makes_the_setting_inconclusive() -> None:
    """Under none the attack leaks 1 of 8 images: a defense that stops it says nothing about
    the defense. A defense it still breaks stays broken (a leak is proof)."""
    board = board_of(
        trial_rows("none", [22.0] + [8.0] * 7),
        trial_rows("G", [8.0] * 8),
        trial_rows("H", [30.0] * 8),
    )
    top = heads(board)
    assert top.loc["G", "verdict"] == "inconclusive"
    # Protocol 2: an attack that leaks 1 of 8 on none vouches for nothing (it needs 50%).
    assert "no attack breaks none here" in top.loc["G", "verdict_note"]
    # ... and it says which attack came nearest, by how much, and what to try.
    assert (
        "the nearest, idlg, leaks 12% of none's images where 50% is needed"
        in top.loc["G", "verdict_note"]
    )
    assert '[[attack]] name = "learned"' in top.loc["G", "verdict_note"]
    old = heads(board_of(*[trial_rows(d, p) for d, p in (
        ("none", [22.0] + [8.0] * 7), ("G", [8.0] * 8))], protocol=1))  # fmt: skip
    assert old.loc["G", "verdict"] == "inconclusive"
    assert "without a defense the attacks leak only 12%" in old.loc["G", "verdict_note"]
    assert top.loc["none", "verdict"] == "baseline"
    assert top.loc["H", "verdict"] == "broken"
    assert np.isnan(top.loc["G", "rank"])
    # No none at all: nothing to compare with, so nothing holds either.
    alone = heads(board_of(trial_rows("G", [8.0] * 8)))
    assert alone.loc["G", "verdict"] == "inconclusive"
    assert "no none baseline" in alone.loc["G", "verdict_note"]


def test_a_defense_whose_adaptive_attack_did_not_run_is_untested_and_ranked_below() -> None:
    prune = json.dumps({"ratio": 0.9})
    board = board_of(
        trial_rows("none", [100.0] * 8),
        trial_rows("prune", [8.0] * 8, defense_params=prune),
        trial_rows("gaussian", [8.0] * 8, defense_params=json.dumps({"sigma": 0.1})),
    )
    top = heads(board)
    assert top.loc["prune", "verdict"] == "untested"
    # The protocol's attacks are named as they run (the rows here are a bare idlg's).
    note = top.loc["prune", "verdict_note"]
    assert "suite attack not run:" in note and "idlg match=kept" in note and "ig match=kept" in note
    assert np.isnan(top.loc["prune", "rank"]) and top.loc["gaussian", "verdict"] == "untested"
    # With the adaptive attack's rows the verdict is judged on them.
    tested = heads(
        board_of(
            trial_rows("none", [100.0] * 8),
            trial_rows("prune", [8.0] * 8, defense_params=prune),
            trial_rows("prune", [100.0] * 8, attack_params=KEPT, defense_params=prune),
        )
    )
    assert tested.loc["prune", "verdict"] == "broken"


def test_adaptive_variants_keep_the_configured_budget_and_fall_back_to_dlg() -> None:
    # Its CIFAR-10 file is not needed for the attacks (a relative path is checked when read).
    spec = load_config(ROOT / "benchmarks" / "cifar10.toml", ["dataset=digits"])
    attacks = spec.attack_grid()
    prune = make_defense("prune", ratio=0.5)
    variants = adaptive_variants(attacks, prune)
    assert [(a.name, a.match) for a in variants] == [("idlg", "kept"), ("ig", "kept")]
    assert variants[0].iterations == attacks[0].iterations == 6000
    # ig has no loss parameter: clipping's cosine loss goes to idlg only.
    clip = adaptive_variants(attacks, make_defense("clip", norm=1.0))
    assert [(a.name, a.loss) for a in clip] == [("idlg", "cosine")]
    # MixUp's learned mixing is a dlg/idlg parameter; a run of ig alone gets dlg for it.
    ig_only = [a for a in attacks if a.name == "ig"]
    mixup = adaptive_variants(ig_only, make_defense("mixup", alpha=1.0))
    assert [(a.name, a.mixing) for a in mixup] == [("dlg", "learn")]
    assert adaptive_variants(attacks, make_defense("none")) == []


def test_the_cifar10_config_runs_prune_s_adaptive_attack_unless_opted_out() -> None:
    text = (ROOT / "benchmarks" / "cifar10.toml").read_text(encoding="utf-8")
    assert "kept" not in text  # the config lists no adaptive attack itself
    dataset = Dataset(
        "tiny",
        Split(np.zeros((20, 32, 32, 3), np.float32), np.arange(20) % 10),
        Split(np.zeros((20, 32, 32, 3), np.float32), np.arange(20) % 10),
        tuple("abcdefghij"),
    )

    def attacks_on(spec, name: str) -> set[tuple[str, str]]:
        return {
            (t.attack.name, t.attack.match) for t in plan(spec, dataset) if t.defense.name == name
        }

    spec = parse_config(text)
    # The standard suite adds the dlg family (and its kept variant) to what the config lists.
    assert attacks_on(spec, "prune") == {
        ("idlg", "all"), ("ig", "all"), ("dlg", "all"), ("idlg", "kept"), ("ig", "kept"),
        ("dlg", "kept"),
    }  # fmt: skip
    assert attacks_on(spec, "gaussian") == {("idlg", "all"), ("ig", "all"), ("dlg", "all")}
    off = parse_config("adaptive = false\n" + text)
    assert attacks_on(off, "prune") == {("idlg", "all"), ("ig", "all")}
    assert "adaptive = false" in off.to_toml() and "adaptive" not in spec.to_toml()


def test_adaptive_must_be_a_boolean() -> None:
    with pytest.raises(Exception, match="adaptive must be true"):
        parse_config('adaptive = "yes"\n[[attack]]\nname = "dlg"\n')


def test_a_malicious_server_alone_never_earns_a_noise_defense_a_holds() -> None:
    # imprint reads none of 40 images under Gaussian noise: without the honest suite's image
    # prior (ig) that is `untested`, not `holds`; what imprint does read stays `broken`.
    def imprint(defense: str, psnrs: list[float], params: str = "{}") -> list:
        rows = trial_rows(defense, psnrs, attack_params="{}", defense_params=params)
        return [{**row, "attack": "imprint", "batch_size": 1} for row in rows]

    board = board_of(
        imprint("none", [100.0] * 40),
        imprint("gaussian", [8.0] * 40, json.dumps({"sigma": 0.1})),
        imprint("int8", [100.0] * 40),
    )
    top = heads(board)
    assert top.loc["gaussian", "verdict"] == "untested"
    assert "ig" in top.loc["gaussian", "verdict_note"]
    assert top.loc["int8", "verdict"] == "broken"
    assert top.loc["none", "verdict"] == "baseline"


def test_a_run_that_opts_out_says_untested_for_prune(tmp_path: Path) -> None:
    config = """
name = "optout"
dataset = "digits"
suite = "listed"
images = 2
adaptive = false
[[attack]]
name = "idlg"
iterations = 60
[[defense]]
name = "none"
[[defense]]
name = "prune"
ratio = 0.99
[training]
enabled = false
"""
    path = tmp_path / "c.toml"
    path.write_text(config, encoding="utf-8")
    result = run_benchmark(load_config(path), tmp_path / "run", progress=False)
    top = heads(result.leaderboard)
    assert set(result.trials["attack_params"].map(lambda p: json.loads(p)["match"])) == {"all"}
    assert top.loc["none", "verdict"] == "baseline"
    if top.loc["prune", "verdict"] != "broken":  # a 60-iteration search rarely beats 99%
        assert top.loc["prune", "verdict"] == "untested"
    written = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert written["identified"].notna().all() and (written["distractors"] == DISTRACTORS).all()


# The identification test.


def digits_pool() -> tuple[Dataset, np.ndarray]:
    dataset = load_dataset("digits")
    return dataset, distractor_pool(dataset, "test")


def test_an_exact_copy_is_identified_and_the_chance_level() -> None:
    dataset, pool = digits_pool()
    originals = np.round(dataset.test.x[:50] * 255).astype(np.uint8)
    assert identified(originals, originals.copy(), pool).all()
    assert len(pool) == DISTRACTORS and chance(len(pool)) == pytest.approx(0.001)


def test_constant_grey_is_identified_no_more_often_than_chance() -> None:
    """A grey image carries nothing of its original: over 450 private images it is nearer its
    own original than all 999 distractors about 450 / 1000 times. Exchangeability bounds
    the count by a Binomial(450, 1/1000) tail: P(count >= 5) < 1e-3."""
    dataset, pool = digits_pool()
    originals = np.round(dataset.test.x * 255).astype(np.uint8)
    grey = np.full_like(originals, 128)
    assert identified(originals, grey, pool).sum() <= 4
    # The pixel distance (LPIPS off) too.
    assert identified(originals, grey, pool, variant="none").sum() <= 4


def test_a_copy_under_strong_noise_is_not_identified() -> None:
    dataset, pool = digits_pool()
    rng = np.random.default_rng(0)
    originals = dataset.test.x[:100]
    noisy = np.clip(originals + rng.normal(0, 1.0, originals.shape), 0, 1)
    flags = identified(np.round(originals * 255).astype(np.uint8), noisy, pool)
    assert flags.sum() <= 5  # noise of std 1 (the whole range) leaves chance, not the image


def test_the_distractor_pool_never_holds_a_private_image() -> None:
    """Private images come from one split, the pool from the other: with every training image
    white and every test image black, the pool of a run whose private images are test images
    is all white, and all black when they are training images."""
    white = np.ones((1500, 4, 4, 1), np.float32)
    black = np.zeros((300, 4, 4, 1), np.float32)
    labels = np.zeros(1500, np.int64)
    dataset = Dataset("marked", Split(white, labels), Split(black, labels[:300]), ("a",))
    pool = distractor_pool(dataset, "test")
    assert len(pool) == DISTRACTORS and (pool == 255).all()
    pool = distractor_pool(dataset, "train")
    assert len(pool) == 300 and (pool == 0).all()  # the smaller split, whole
    # A fixed pool: the same sorted, distinct indices every time.
    first = distractor_indices(1500, DISTRACTORS)
    np.testing.assert_array_equal(first, distractor_indices(1500, DISTRACTORS))
    assert len(np.unique(first)) == DISTRACTORS and first.max() < 1500


def test_recognisable_and_interval_by_hand() -> None:
    flags = recognisable(np.array([np.nan, 0.02, 0.021, 0.5]), np.array([21.0, 5.0, 20.9, 30.0]))
    assert flags.tolist() == [True, True, False, True]
    low, high = exact_interval(0, 8)
    assert low == 0.0 and high == pytest.approx(0.3694, abs=1e-4)
    assert exact_interval(8, 8)[0] == pytest.approx(0.6306, abs=1e-4)
