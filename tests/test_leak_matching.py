"""Counting leaked images by a maximum-cardinality matching of each batch's leak graph
(`leakbench.components.leakage.matched_leaks`, `leakbench.run.identification.add_flags`):
the total-MSE assignment of the fidelity scores may pair an exact reconstruction with the
wrong original to win on blends; the leak count must not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leakbench.components.leakage import matched_leaks
from leakbench.components.metrics import score_batch
from leakbench.datasets import Dataset, load_dataset
from leakbench.outputs.arrays import cell_id, encode_trial, export_arrays
from leakbench.outputs.leak_flags import with_leak_flags
from leakbench.run.identification import add_flags

SUCCESS_MSE = 1e-3
CELL = {
    "run": "r", "dataset": "digits", "model": "m", "attack": "a", "attack_params": "{}",
    "defense": "none", "defense_params": "{}",
}  # fmt: skip


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def write_cell(
    out: Path, batches: list[tuple[np.ndarray, np.ndarray]], variant: str | None
) -> pd.DataFrame:
    """A run directory's rows and ``arrays/`` for one cell, one trial per (originals,
    reconstructions) batch, scored as a run scores them (`score_batch`: Hungarian on MSE)."""
    rows, blobs = [], {}
    for batch, (originals, reconstructions) in enumerate(batches):
        labels = np.zeros(len(originals), np.int64)
        scores = score_batch(originals, labels, reconstructions, labels, variant)
        for position in range(len(originals)):
            rows.append(
                {
                    **CELL,
                    "seed": 0,
                    "batch_index": batch,
                    "position": position,
                    "image_index": 10 * batch + position,
                    "batch_size": len(originals),
                    "label": 0,
                    "predicted_label": 0,
                    "mse": scores.mse[position],
                    "psnr": scores.psnr[position],
                    "ssim": scores.ssim[position],
                    "lpips": scores.lpips[position],
                    "label_acc": 1.0,
                    "status": "ok",
                    "seconds": 1.0,
                }  # fmt: skip
            )
        matched = np.asarray(reconstructions)[scores.order]
        blobs[(0, batch, cell_id(CELL))] = encode_trial(originals, matched, np.zeros(1))
    frame = pd.DataFrame(rows)
    export_arrays(frame, blobs, out)
    return frame


def counts(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per trial, the old count (the MSE-assigned rows' own flags) and the new one."""
    old = with_leak_flags(frame.drop(columns="leak_matched"), SUCCESS_MSE)["leaked"]
    trial = [frame["seed"], frame["batch_index"]]
    return old.groupby(trial).sum(), frame["leaked"].groupby(trial).sum()


def test_a_batch_whose_mse_assignment_breaks_exact_matches_by_hand(
    digits: Dataset, tmp_path: Path
) -> None:
    """Originals a, b, c; reconstructions: a exact, c exact, and ``far``, which lies beyond a
    as seen from b (2a - b, clipped). Squared errors break the triangle inequality: pairing a's
    exact copy with b and ``far`` with a costs about 2 * MSE(a, b), less than MSE(far, b) of
    the identity, so the total-MSE assignment gives up an exact match for two blends. The old
    count is 1 (c); the matching finds a's and c's exact copies: 2.

    ``far`` looks like an exaggerated a and is identified as a (and c's copy as c); in a cell
    of 3 images those hits would count, so the batch sits in a cell with 150 trials of noise
    (2 hits in 153 are within chance), as it would in a run, and the count is by recovery
    alone."""
    x = np.asarray(digits.test.x)
    a, b, c = x[0], x[1], x[2]
    far = np.clip(2 * a - b, 0, 1)
    originals = np.stack([a, b, c])
    reconstructions = np.stack([c, far, a])  # in an order the attack does not know
    rng = np.random.default_rng(0)
    noise = [(x[k : k + 1], rng.uniform(0, 1, x[k : k + 1].shape)) for k in range(10, 160)]
    frame = write_cell(tmp_path, [(originals, reconstructions), *noise], "none")
    scores = score_batch(originals, np.zeros(3, np.int64), reconstructions, np.zeros(3), None)
    assert scores.order.tolist() == [1, 2, 0]  # far -> a, a's copy -> b, c -> c
    assert scores.mse[2] == 0.0 and scores.mse[0] > SUCCESS_MSE and scores.mse[1] > SUCCESS_MSE
    flagged = add_flags(frame, tmp_path, digits, "test", "none", SUCCESS_MSE)
    assert flagged["identified"].tolist()[:3] == [1.0, 0.0, 1.0]  # far as a, c's copy as c
    assert flagged["identified"].sum() == 2  # within chance in 153
    old, new = counts(flagged)
    assert old.loc[(0, 0)] == 1 and new.loc[(0, 0)] == 2
    assert (old.drop((0, 0)) == 0).all() and (new.drop((0, 0)) == 0).all()
    batch = flagged[flagged["batch_index"] == 0]
    assert batch["leak_matched"].tolist() == [1.0, 0.0, 1.0]  # a and c, not b
    # The fidelity columns keep the MSE assignment.
    np.testing.assert_allclose(batch["mse"], scores.mse)


def test_the_matching_prefers_the_assigned_leaked_pairs() -> None:
    """Every reconstruction leaks every original: any perfect matching is maximum; the one
    kept covers the assigned pairs (here all), and a graph of no edge but the assigned leaked
    pairs gives exactly those."""
    full = np.ones((3, 3), bool)
    assert matched_leaks(full, np.array([True, False, True])).tolist() == [True, True, True]
    none = np.zeros((3, 3), bool)
    assert matched_leaks(none, np.array([False, True, False])).tolist() == [False, True, False]
    # A chain: r0 leaks o0 and o1, r1 leaks o0 only; maximum matching r0-o1, r1-o0.
    chain = np.array([[True, True], [True, False]])
    assert matched_leaks(chain, np.array([True, False])).tolist() == [True, True]
    with pytest.raises(ValueError, match="square graph"):
        matched_leaks(np.ones((2, 3), bool), np.ones(2, bool))


@pytest.mark.parametrize("variant", ["none", "alex"])
def test_random_batches_count_at_least_as_many_and_b1_is_unchanged(
    digits: Dataset, tmp_path: Path, variant: str
) -> None:
    """Random batches of 1 to 4 images whose reconstructions are a random mix of exact
    copies of some original of the batch, reflections (2a - b), blends and noise: per trial
    the new count is at least the old, at most B, and equal to it for B = 1."""
    rng = np.random.default_rng(7)
    x = np.asarray(digits.test.x)
    batches = []
    for _ in range(40):
        size = int(rng.integers(1, 5))
        originals = x[rng.choice(len(x), size, replace=False)]
        recs = []
        for _ in range(size):
            i, j = rng.integers(size), rng.integers(size)
            kind = rng.integers(4)
            if kind == 0:
                recs.append(originals[i])
            elif kind == 1:
                recs.append(np.clip(2 * originals[i] - originals[j], 0, 1))
            elif kind == 2:
                recs.append((originals[i] + originals[j]) / 2)
            else:
                recs.append(rng.uniform(0, 1, originals[i].shape).astype(np.float32))
        batches.append((originals, np.stack(recs)))
    frame = write_cell(tmp_path, batches, variant)
    flagged = add_flags(frame, tmp_path, digits, "test", variant, SUCCESS_MSE)
    assert flagged["leak_matched"].notna().all()
    old, new = counts(flagged)
    sizes = flagged.groupby([flagged["seed"], flagged["batch_index"]]).size()
    assert (new >= old).all() and (new <= sizes).all()
    assert (new[sizes == 1] == old[sizes == 1]).all() and (sizes == 1).any()


def test_rows_without_arrays_keep_their_own_flags(digits: Dataset, tmp_path: Path) -> None:
    """No arrays: ``leak_matched`` is NaN and ``leaked`` is the row's own flags."""
    x = np.asarray(digits.test.x)
    frame = write_cell(tmp_path, [(x[:2], x[:2][::-1])], "none")
    flagged = add_flags(frame, tmp_path / "elsewhere", digits, "test", "none", SUCCESS_MSE)
    assert flagged["leak_matched"].isna().all() and flagged["identified_null"].isna().all()
    assert flagged["leaked"].tolist() == [1.0, 1.0]  # both exact once matched
