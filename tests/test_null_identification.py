"""Identification against a measured null (`leakbench.components.leakage`, "The measured
null"): a reconstruction that knows only its recovered label is identified far more often
than ``1 / (pool + 1)``, so a cell's identifications are tested against the measured rate of
standing null reconstructions; and an audit without public images never draws its pool from
the private ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

import leakbench
from leakbench.components.leakage import (
    NULL_DRAWS,
    NULL_STD,
    NULL_STREAM,
    beyond_chance,
    chance,
    distractor_pool,
    identification_chance,
    identified,
)
from leakbench.datasets import Dataset, load_dataset
from leakbench.datasets.base import Split
from leakbench.outputs.arrays import cell_id, encode_trial, export_arrays
from leakbench.outputs.tables import leaderboard
from leakbench.run.identification import IDENTIFICATION_OFF, add_flags

SUCCESS_MSE = 1e-3
CELL = {
    "run": "r", "dataset": "digits", "model": "m", "attack": "a", "attack_params": "{}",
    "defense": "none", "defense_params": "{}",
}  # fmt: skip


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def to8(images: np.ndarray) -> np.ndarray:
    return np.round(np.clip(images, 0, 1) * 255).astype(np.uint8)


def label_only(dataset: Dataset, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Reconstructions that know only their label: the training split's class mean plus
    noise of the null's std (another draw than the null's own)."""
    x, y = np.asarray(dataset.train.x, np.float64), np.asarray(dataset.train.y)
    means = np.stack([x[y == c].mean(0) for c in range(dataset.num_classes)])
    return np.clip(means[labels] + rng.normal(0, NULL_STD, (len(labels), *x.shape[1:])), 0, 1)


def write_cell(
    out: Path, originals: np.ndarray, labels: np.ndarray, recs: np.ndarray
) -> pd.DataFrame:
    """One cell of batch-size-1 trials (batch i attacks test image i, label recovered), its
    rows scored by MSE/PSNR (LPIPS from the cell's arrays is not needed here) and its arrays."""
    errors = ((to8(originals) / 255.0 - to8(recs) / 255.0) ** 2).mean(axis=(1, 2, 3))
    rows = [
        {
            **CELL,
            "seed": 0,
            "batch_index": i,
            "position": 0,
            "image_index": i,
            "batch_size": 1,
            "label": int(labels[i]),
            "predicted_label": int(labels[i]),
            "mse": errors[i],
            "psnr": 10 * np.log10(1 / max(errors[i], 1e-10)),
            "ssim": np.nan,
            "lpips": 0.5,
            "label_acc": 1.0,
            "status": "ok",
            "seconds": 1.0,
        }  # fmt: skip
        for i in range(len(originals))
    ]
    frame = pd.DataFrame(rows)
    blobs = {
        (0, i, cell_id(CELL)): encode_trial(originals[i : i + 1], recs[i : i + 1], np.zeros(1))
        for i in range(len(originals))
    }
    export_arrays(frame, blobs, out)
    return frame


def test_the_class_mean_null_is_identified_at_its_measured_rate(
    digits: Dataset, tmp_path: Path
) -> None:
    """Every test image of digits (450) under LPIPS: the null of the stated rule, built here
    by hand (the training split's class mean of the recovered label, noise of std NULL_STD
    seeded by (NULL_STREAM, seed, batch, position), 8 bits), is identified at a rate well
    above 1/1000 (about 1.2%), and that rate is the cell's ``identified_null``, the same on a
    second export and the leaderboard's ``identified_chance``."""
    originals, labels = np.asarray(digits.test.x), np.asarray(digits.test.y)
    pool = distractor_pool(digits, "test")
    x, y = np.asarray(digits.train.x, np.float64), np.asarray(digits.train.y)
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    nulls = np.concatenate(
        [
            to8(means[labels[i]] + np.random.default_rng([NULL_STREAM, 0, i, 0]).standard_normal(
                (NULL_DRAWS, *means.shape[1:])) * NULL_STD)
            for i in range(len(originals))
        ]
    )  # fmt: skip
    by_hand = identified(np.repeat(to8(originals), NULL_DRAWS, axis=0), nulls, pool, "alex")
    rate = float(by_hand.mean())
    assert rate >= 5 * chance(len(pool))  # measured: 0.0117 (42 of 3,600)
    rng = np.random.default_rng(1)
    frame = write_cell(tmp_path, originals, labels, label_only(digits, labels, rng))
    flagged = add_flags(frame, tmp_path, digits, "test", "alex", SUCCESS_MSE)
    assert flagged["identified_null"].tolist() == [rate] * len(frame)
    again = add_flags(frame, tmp_path, digits, "test", "alex", SUCCESS_MSE)
    pd.testing.assert_series_equal(again["identified_null"], flagged["identified_null"])
    board = leaderboard(flagged, SUCCESS_MSE)
    assert board["identified_chance"].tolist() == [rate]


def test_hits_the_null_explains_are_no_leak_though_one_in_1000_would_count_them(
    digits: Dataset, tmp_path: Path
) -> None:
    """Reconstructions that know only the label (class mean plus noise, no attack) are
    identified about as often as the null. Against 1/1000 their hits are far beyond chance
    and every one would count as leaked; against the measured null none does. (By LPIPS the
    noise brings 2 of the 450 nearer than the class mean and below the digits' null bound,
    which the bound's 1% level allows: they are recognisable, not identified.)"""
    originals, labels = np.asarray(digits.test.x), np.asarray(digits.test.y)
    recs = label_only(digits, labels, np.random.default_rng(1))
    frame = write_cell(tmp_path, originals, labels, recs)
    flagged = add_flags(frame, tmp_path, digits, "test", "alex", SUCCESS_MSE)
    hits, n = int(flagged["identified"].sum()), len(flagged)
    null = float(flagged["identified_null"].iloc[0])
    assert beyond_chance(hits, n, chance(999)) and not beyond_chance(hits, n, null)
    board = leaderboard(flagged, SUCCESS_MSE)
    assert board["leaked_rate"].iloc[0] <= 0.01
    leaked = flagged[flagged["leaked"] == 1]
    assert (leaked["recognisable"] == 1).all()  # no identification counts
    assert (flagged["leak_matched"] == flagged["leaked"]).all()
    # The same rows judged against 1/1000 (no measured null, no matching): every hit leaks.
    old = leaderboard(flagged.drop(columns=["identified_null", "leak_matched"]), SUCCESS_MSE)
    counted = ((flagged["identified"] == 1) | (flagged["recognisable"] == 1)).sum()
    assert hits > (flagged["recognisable"] == 1).sum()
    assert old["leaked_rate"].tolist() == [counted / n] and old["identified_chance"].tolist() == [
        pytest.approx(1 / 1000)
    ]


def test_a_null_never_identified_is_floored_at_one_in_pool_plus_one() -> None:
    """A measured rate of 0 does not make one hit a leak: the level is 1/1000 then, under
    which one hit in 32 is within chance (p = 0.03) and one in 8 is not (p = 0.008)."""
    assert (
        identification_chance(999, 0.0)
        == identification_chance(999, None)
        == identification_chance(999, np.nan)
    )
    assert identification_chance(999, 0.0) == pytest.approx(1 / 1000)
    assert identification_chance(999, 0.02) == 0.02

    def cell(n: int, defense: str) -> list[dict]:
        rows = [
            {
                **CELL,
                "defense": defense,
                "seed": 0,
                "batch_index": i,
                "position": 0,
                "image_index": i,
                "batch_size": 1,
                "label": 0,
                "predicted_label": 0,
                "mse": 0.3,
                "psnr": 5.2,
                "ssim": np.nan,
                "lpips": 0.5,
                "label_acc": 1.0,
                "status": "ok",
                "seconds": 1.0,
                "identified": float(i == 0),
                "distractors": 999.0,
                "identified_null": 0.0,
            }  # fmt: skip
            for i in range(n)
        ]
        return rows

    for rows, leaked in ((cell(32, "A"), 0.0), (cell(8, "B"), 1 / 8)):
        board = leaderboard(pd.DataFrame(rows), SUCCESS_MSE)  # one cell: no correction
        assert board["leaked_rate"].tolist() == [leaked]


def test_identification_is_off_when_the_public_split_is_the_private_one(tmp_path: Path) -> None:
    """A dataset whose two splits are the same images has no pool that holds no private
    image: identification is off (NaN), with one warning line saying why."""
    x = np.random.default_rng(0).uniform(0, 1, (20, 4, 4, 1)).astype(np.float32)
    y = np.zeros(20, np.int64)
    same = Dataset("same", Split(x, y), Split(x.copy(), y.copy()), ("a",))
    frame = write_cell(tmp_path, x[:3], y[:3], x[:3])
    with pytest.warns(UserWarning, match="identification is off") as caught:
        flagged = add_flags(frame, tmp_path, same, "test", "none", SUCCESS_MSE)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert str(caught[0].message) == IDENTIFICATION_OFF
    for column in ("identified", "identified_null", "distractors"):
        assert flagged[column].isna().all()
    assert (flagged["leaked"] == 1).all()  # exact copies still leak, by recovery


def _model(digits: Dataset) -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input(digits.input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(digits.num_classes, activation="softmax"),
        ]
    )


def test_an_audit_without_public_images_draws_no_pool_from_its_private_ones(
    digits: Dataset,
) -> None:
    """`leakbench.audit` attacks every image it is given, so without ``public`` none is left
    for a pool: identification is off, with the warning. With ``public`` the pool is drawn
    from those images only (all 60 of them here, none a private image)."""
    model, images, labels = _model(digits), digits.test.x[:2], digits.test.y[:2]
    attacks = [{"name": "idlg", "iterations": 3}]
    with pytest.warns(UserWarning, match="identification is off"):
        bare = leakbench.audit(model, images, labels, attacks=attacks, lpips="none",
                               adaptive=False, progress=False)  # fmt: skip
    assert bare.trials["identified"].isna().all() and bare.trials["distractors"].isna().all()
    public = (digits.train.x[:60], digits.train.y[:60])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="identification is off")
        given = leakbench.audit(model, images, labels, attacks=attacks, lpips="none",
                                adaptive=False, progress=False, public=public)  # fmt: skip
    assert given.trials["identified"].notna().all()
    assert (given.trials["distractors"] == 60).all()
    assert given.trials["identified_null"].notna().all()


def test_a_second_flagging_of_the_same_run_reuses_the_pool_and_the_null(
    digits: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged run flags its trials against none at every gate and all of them at the end:
    the distractor pool is embedded, and each image's null drawn, once per process, and the
    flags are those of a fresh judge."""
    from leakbench.run import identification

    originals, labels = np.asarray(digits.test.x)[:12], np.asarray(digits.test.y)[:12]
    frame = write_cell(
        tmp_path, originals, labels, label_only(digits, labels, np.random.default_rng(2))
    )
    identification._JUDGES.clear()
    made, drawn = [], []
    real_of, real_nulls = identification.Identification.of, identification.null_reconstructions
    monkeypatch.setattr(identification.Identification, "of",
                        lambda *a: made.append(1) or real_of(*a))  # fmt: skip
    monkeypatch.setattr(identification, "null_reconstructions",
                        lambda *a: drawn.append(1) or real_nulls(*a))  # fmt: skip
    first = add_flags(frame, tmp_path, digits, "test", "none", SUCCESS_MSE)
    assert (len(made), len(drawn)) == (1, 12)
    again = add_flags(frame, tmp_path, digits, "test", "none", SUCCESS_MSE)
    assert (len(made), len(drawn)) == (1, 12)
    pd.testing.assert_frame_equal(again, first)
    identification._JUDGES.clear()
    fresh = add_flags(frame, tmp_path, digits, "test", "none", SUCCESS_MSE)
    assert len(made) == 2
    pd.testing.assert_frame_equal(fresh, first)
