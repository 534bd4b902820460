"""The standard attack suite (protocol 1, `leakbench.attacks.suite`) and the verdict rules that
rest on it (`leakbench.outputs.verdicts`): what a config listing one attack runs, the two-stage
run, and hand-made boards for the statistics of a ``holds``, a ``broken`` and the union."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.suite import PROTOCOL, expected
from leakbench.components.leakage import exact_interval
from leakbench.defenses import make_defense
from leakbench.outputs.tables import leaderboard
from leakbench.outputs.verdicts import UNCONVERGED, UNDERPOWERED, verdict
from leakbench.run.config import parse_config
from leakbench.run.runner import plan_lines, stage_labels
from leakbench.run.stages import gate, split

# The config: CIFAR-10-like, but on the embedded digits so it parses offline.
ONE_ATTACK = """
name = "one"
images = 8
[[attack]]
name = "idlg"
[[defense]]
name = "none"
[[defense]]
name = "gaussian"
sigma = [1e-3, 3e-3]
[[defense]]
name = "prune"
ratio = 0.5
[training]
enabled = false
"""


def _names(attacks) -> list[tuple[str, str, str]]:
    return [(a.name, getattr(a, "match", ""), getattr(a, "loss", "")) for a in attacks]


def test_a_config_listing_one_attack_meets_the_whole_suite_and_prune_meets_ig_kept() -> None:
    spec = parse_config(ONE_ATTACK)
    assert spec.protocol == PROTOCOL and 'suite = "standard"' in spec.to_toml()
    assert "protocol = 2" in spec.to_toml()
    prune = next(d for d in spec.defense_grid() if d.name == "prune")
    against = _names(spec.attacks_for(prune))
    assert against == [
        ("idlg", "all", "l2"),
        ("dlg", "all", "l2"),
        ("ig", "all", "cosine"),
        ("idlg", "kept", "l2"),
        ("dlg", "kept", "l2"),
        ("ig", "kept", "cosine"),
    ]
    # none meets every defense's adaptive attacks, so each can vouch for itself there.
    none = next(d for d in spec.defense_grid() if d.name == "none")
    assert set(against) <= set(_names(spec.attacks_for(none)))


def test_suite_listed_runs_the_listed_attacks_and_leaves_prune_untested() -> None:
    spec = parse_config('suite = "listed"\n' + ONE_ATTACK)
    assert spec.protocol == 0 and "protocol" not in spec.to_toml()
    prune = next(d for d in spec.defense_grid() if d.name == "prune")
    assert _names(spec.attacks_for(prune)) == [("idlg", "all", "l2"), ("idlg", "kept", "l2")]
    assert parse_config(spec.to_toml()) == spec
    rows = _rows("none", [100.0] * 40) + _rows("prune", [5.0] * 40, '{"ratio":0.5}')
    board = leaderboard(pd.DataFrame(rows), 1e-3, protocol=spec.protocol)
    assert set(board.loc[board["defense"] == "prune", "verdict"]) == {"untested"}
    assert board["rank"].isna().all()


def test_laplace_meets_its_maximum_likelihood_l1_loss() -> None:
    attacks = expected(make_defense("laplace", b=0.01), batch_size=1)
    assert ("dlg", "all", "l1") in _names(attacks) and ("idlg", "all", "l1") in _names(attacks)
    # ig keeps its cosine: protocol 1 gives the defenses' loss settings to dlg and idlg only.
    assert [a.loss for a in attacks if a.name == "ig"] == ["cosine"]
    dummy, observed = [tf.constant([[1.0, -2.0]])], [tf.constant([[0.5, 1.0]])]
    assert float(LOSSES.get("l1")(dummy, observed)[0]) == pytest.approx(3.5)


def test_a_config_that_names_another_protocol_is_refused() -> None:
    with pytest.raises(Exception, match="protocol must be one of 1, 2"):
        parse_config("protocol = 3\n" + ONE_ATTACK)


def test_a_record_of_protocol_1_is_judged_by_protocol_1() -> None:
    """A committed run of protocol 1 keeps its rules (its tables are reproduced), and
    writes the protocol it states."""
    spec = parse_config("protocol = 1\n" + ONE_ATTACK)
    assert spec.protocol == 1 and "protocol = 1" in spec.to_toml()
    assert parse_config(ONE_ATTACK).protocol == PROTOCOL == 2


def _rows(defense: str, psnrs: list[float], params: str = "{}", attack: str = "idlg",
          **extra) -> list[dict]:  # fmt: skip
    """One trial row per image (image i is private index i of model seed i % 2: protocol 2's
    `holds` needs two seeds)."""
    return [
        {
            "run": "r", "dataset": "d", "model": "m", "attack": attack,
            "attack_params": extra.get("attack_params", '{"match":"all"}'), "defense": defense,
            "defense_params": params, "seed": i % 2, "batch_index": i, "position": 0,
            "image_index": i, "batch_size": 1, "label": 0, "predicted_label": 0,
            "mse": 10 ** (-p / 10), "psnr": p, "ssim": np.nan, "lpips": np.nan,
            "label_acc": 1.0, "status": "ok", "seconds": 1.0, "identified": 0.0,
            "distractors": 999.0, "stop_reason": extra.get("stop_reason", ""),
            "converged": extra.get("converged", np.nan),
        }
        for i, p in enumerate(psnrs)
    ]  # fmt: skip


def _board(*cells: list, protocol: int = PROTOCOL) -> pd.DataFrame:
    return leaderboard(pd.DataFrame([r for c in cells for r in c]), 1e-3, protocol=protocol)


def _verdict(board: pd.DataFrame, defense: str) -> str:
    return str(board.loc[board["defense"] == defense, "verdict"].iloc[0])


@pytest.mark.parametrize(("n", "expected_verdict"), [(8, UNDERPOWERED), (32, UNDERPOWERED),
                                                     (36, "holds")])  # fmt: skip
def test_nothing_leaked_holds_only_with_enough_images(n: int, expected_verdict: str) -> None:
    # 0 of n: the 95% upper bound is 1 - 0.025^(1/n): 36.9% at 8, 10.9% at 32, 9.7% at 36.
    assert (exact_interval(0, n)[1] < 0.10) == (n >= 36)
    assert verdict(0, n) == expected_verdict
    board = _board(_rows("none", [100.0] * n), _rows("noise", [5.0] * n))
    assert _verdict(board, "noise") == expected_verdict
    ranked = board.loc[board["defense"] == "noise", "rank"]
    assert ranked.notna().all() == (expected_verdict == "holds")


def test_none_is_the_baseline_and_never_ranked_or_broken() -> None:
    board = _board(_rows("none", [100.0] * 36), _rows("noise", [5.0] * 36))
    none = board[board["defense"] == "none"]
    assert set(none["verdict"]) == {"baseline"} and none["rank"].isna().all()


def test_the_union_over_the_suite_leaks_more_than_the_strongest_single_attack() -> None:
    # Two attacks each leak a different 3 of 36 images (8.3% each, below the broken line);
    # together 6 of 36 (16.7%): broken, though no single attack is.
    low = [5.0] * 36
    first = [30.0 if i < 3 else 5.0 for i in range(36)]
    second = [30.0 if 3 <= i < 6 else 5.0 for i in range(36)]
    kept = '{"match":"kept"}'
    board = _board(
        _rows("none", [100.0] * 36),
        _rows("none", [100.0] * 36, attack_params=kept),
        _rows("prune", first, '{"ratio":0.5}'),
        _rows("prune", second, '{"ratio":0.5}', attack_params=kept),
        _rows("other", low),
    )
    prune = board[board["defense"] == "prune"]
    assert prune["leaked_rate"].max() == pytest.approx(3 / 36)
    assert set(prune["suite_leaked"]) == {6} and set(prune["suite_n"]) == {36}
    # 6 of 36 (95% CI 6.4-32.8%): protocol 2 needs the lower end at 10% for broken.
    assert _verdict(board, "prune") == "leaks"
    more = [30.0 if 3 <= i < 12 else 5.0 for i in range(36)]
    board = _board(
        _rows("none", [100.0] * 36),
        _rows("none", [100.0] * 36, attack_params=kept),
        _rows("prune", first, '{"ratio":0.5}'),
        _rows("prune", more, '{"ratio":0.5}', attack_params=kept),
    )
    assert set(board.loc[board["defense"] == "prune", "suite_leaked"]) == {12}
    assert _verdict(board, "prune") == "broken"  # 12 of 36: 95% CI 18.6-51.0%


def test_a_one_image_broken_is_leaks() -> None:
    # 1 of 8 is 12.5%, above the broken line, but one image proves a leak, not a rate.
    for protocol in (1, 2):
        board = _board(
            _rows("none", [100.0] * 8), _rows("noise", [30.0] + [5.0] * 7), protocol=protocol
        )
        assert _verdict(board, "noise") == "leaks"
    # 2 of 8: broken by protocol 1's point estimate, leaks by protocol 2 (95% CI 3.2-65.1%).
    two = [_rows("none", [100.0] * 8), _rows("noise", [30.0, 30.0] + [5.0] * 6)]
    assert _verdict(_board(*two, protocol=1), "noise") == "broken"
    assert _verdict(_board(*two), "noise") == "leaks"


def test_an_attack_that_did_not_converge_cannot_earn_a_holds() -> None:
    # The attack ends well above the true input's loss on 3 of 36 images: inconclusive.
    flags = [0.0 if i < 3 else 1.0 for i in range(36)]
    rows = _rows("none", [100.0] * 36, stop_reason="converged", converged=1.0)
    defended = _rows("noise", [5.0] * 36, stop_reason="budget")
    for row, flag in zip(defended, flags, strict=True):
        row["converged"] = flag
    board = _board(rows, defended)
    assert _verdict(board, "noise") == UNCONVERGED
    for row in defended:
        row["converged"] = 1.0
    assert _verdict(_board(rows, defended), "noise") == "holds"


def test_an_attack_that_cannot_break_none_does_not_vouch_for_a_holds() -> None:
    # idlg breaks none and fails under noise; dlg fails everywhere. A holds needs idlg.
    weak = '{"match":"all","loss":"l2"}'
    rows = (
        _rows("none", [100.0] * 36)
        + _rows("none", [5.0] * 36, attack="dlg", attack_params=weak)
        + _rows("noise", [5.0] * 36, attack="dlg", attack_params=weak)
    )
    board = leaderboard(pd.DataFrame(rows), 1e-3)
    vouched = board.set_index(["defense", "attack"])["vouched"]
    assert vouched[("none", "idlg")] and not vouched[("none", "dlg")]
    assert _verdict(board, "noise") == UNCONVERGED  # no vouching attack attacked its images


def test_a_stronger_setting_that_leaks_more_is_flagged() -> None:
    # sigma 0.001 leaks one image (leaks), the hundred times stronger 0.1 ten (broken).
    board = _board(
        _rows("none", [100.0] * 36),
        _rows("gaussian", [30.0] + [5.0] * 35, '{"sigma":0.001}'),
        _rows("gaussian", [30.0] * 10 + [5.0] * 26, '{"sigma":0.1}'),
    )
    notes = board.set_index("defense_params")["verdict_note"]
    assert "not monotone" in notes['{"sigma":0.1}']
    assert "not monotone" not in notes['{"sigma":0.001}']


def test_later_stages_run_only_where_they_can_change_a_verdict() -> None:
    from leakbench.datasets import load_dataset
    from leakbench.run.plan import plan

    spec = parse_config(ONE_ATTACK.replace("images = 8", "images = 2"))
    trials = plan(spec, load_dataset("digits"))
    stages = split(spec.standard, trials, whole=True)
    assert [sorted({t.attack.name for t in s if t.defense.name != "none"}) for s in stages] == [
        [],
        ["idlg"],
        ["dlg"],
        ["ig"],
    ]
    assert all(t.defense.name == "none" for t in stages[0])
    assert split(spec.standard, trials, whole=False) == [trials]
    # The progress bars name each stage by its family; a run of one stage names none.
    assert stage_labels(stages) == [
        "stage 1/4 (none)", "stage 2/4 (idlg)", "stage 3/4 (dlg)", "stage 4/4 (ig)"
    ]  # fmt: skip
    assert stage_labels([trials]) == [""]
    lines = plan_lines("one", Path("runs/one"), len(trials), 3, stage_labels(stages), (4, 1, 2))
    assert lines == [
        "run one into runs/one",
        "4 private examples under 2 defense configurations",
        f"3 utility trainings, then at most {len(trials)} attack trials in 4 stages; a rerun "
        "resumes",
    ]
    two = plan_lines("two", Path("runs/two"), 8, 0, [""], (4, 2, 2))[1]
    assert two == "4 private examples on each of 2 seeds under 2 defense configurations"
    ran, later = [t for s in stages[:-1] for t in s], stages[-1]

    def row(trial, psnr: float) -> dict:
        return {"attack": trial.attack.name,
                "attack_params": json.dumps(trial.attack.params(), sort_keys=True,
                                            separators=(",", ":")),
                "defense": trial.defense.name,
                "defense_params": json.dumps(trial.defense.params(), sort_keys=True,
                                             separators=(",", ":")),
                "seed": trial.seed, "batch_index": trial.batch_index,
                "image_index": trial.indices[0], "mse": 10 ** (-psnr / 10), "psnr": psnr,
                "lpips": np.nan}  # fmt: skip

    # ig breaks none; under gaussian 1e-3 idlg already leaked image 0: ig runs on the rest.
    rows = []
    for t in ran:
        leak = t.defense.name == "none" or (
            t.defense.params().get("sigma") == 1e-3 and t.batch_index == 0
        )
        rows.append(row(t, 40.0 if leak else 5.0))
    chosen = gate(ran, later, rows, 1e-3)
    assert chosen and all(t.attack.name == "ig" for t in chosen)
    skipped = [t for t in later if t not in chosen]
    assert skipped and all(
        t.defense.params().get("sigma") == 1e-3 and t.batch_index == 0 for t in skipped
    )
    # ig fails on none: it vouches for nothing and is not spent on the defenses.
    rows = [row(t, 5.0 if t.attack.name == "ig" else 40.0) for t in ran]
    assert gate(ran, later, rows, 1e-3) == []
    # A cheap family is not held to vouching, only to the images left: dlg runs where idlg
    # leaked nothing.
    rows = [row(t, 40.0 if t.defense.name == "none" else 5.0) for t in stages[0] + stages[1]]
    assert gate(stages[0] + stages[1], stages[2], rows, 1e-3) == stages[2]
