"""Mid-trial resumption (issue 45): an ig loop interrupted after k iterations and resumed from
its checkpoint (`leakbench.run.partial`, `leakbench.attacks.engine.resume`) computes what the
uninterrupted loop computes, bit for bit; a checkpoint of another group or engine version, or
one that cannot be read, is ignored with a warning; the file is gone once the trial is stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from configs import run_config

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine import lanes, resume
from leakbench.components.forward import model_gradients
from leakbench.outputs.tables import TIMING_COLUMNS
from leakbench.run import local, partial
from leakbench.run.config import parse_config
from leakbench.run.partial import GroupCheckpoint, checkpoint_path
from leakbench.run.runner import run_benchmark

ITERATIONS = 12
STOP_AT = 5  # the interruption lands after this many iterations


class Interrupted(Exception):
    """What the test's hook raises in place of a Ctrl-C."""


class Stopping(GroupCheckpoint):
    """A checkpoint that interrupts the attack once ``at`` iterations of a loop are done."""

    at: int | None = None

    def progress(self, tag: str, done: int, total: int) -> None:
        if self.at is not None and done >= self.at:
            raise Interrupted(tag)


@pytest.fixture(autouse=True)
def one_iteration_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Chunks never grow: every iteration is a chunk, so the interruption lands exactly.
    monkeypatch.setattr(resume, "CHUNK_SECONDS", 0.0)


def _target(digits, lenet) -> AttackTarget:
    x, y = digits.test.x[:1], digits.test.y[:1]
    grads = model_gradients(lenet, tf.constant(x), tf.one_hot(y, 10))
    return AttackTarget(lenet, tuple(grads), (8, 8, 1), 1, 10)


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.loss_history, b.loss_history)
    assert a.loss == b.loss
    assert (a.evaluations, a.iterations_used) == (b.evaluations, b.iterations_used)


def test_an_interrupted_ig_resumes_to_the_uninterrupted_reconstruction(
    digits, lenet, tmp_path: Path
) -> None:
    attack = make_attack("ig", iterations=ITERATIONS, tv=1e-4, starts=2)
    target = _target(digits, lenet)
    straight = attack.attack_many([target], [3])[0]

    first = Stopping(tmp_path, "group", every=0.0)
    first.at = STOP_AT
    with resume.saving(first), pytest.raises(Interrupted):
        attack.attack_many([target], [3])
    path = checkpoint_path(tmp_path, "group")
    assert path.exists() and not list(path.parent.glob("*.tmp"))

    again = GroupCheckpoint(tmp_path, "group", every=0.0)
    assert list(again.resumed.values()) == [STOP_AT]  # read back at the iteration it stopped
    with resume.saving(again):
        resumed = attack.attack_many([target], [3])[0]
    _same(resumed, straight)
    assert len(resumed.loss_history) == ITERATIONS


def test_a_finished_loop_is_not_run_again(digits, lenet, tmp_path: Path) -> None:
    attack = make_attack("ig", iterations=4, tv=1e-4)
    target = _target(digits, lenet)
    with resume.saving(GroupCheckpoint(tmp_path, "g", every=3600.0)):
        done = attack.attack_many([target], [0])[0]
    # The last chunk is written whatever the interval; a rerun reads it and runs no chunk.
    reported: list[tuple[int, int]] = []

    class Watching(GroupCheckpoint):
        def progress(self, tag: str, done: int, total: int) -> None:
            reported.append((done, total))

    later = Watching(tmp_path, "g", every=3600.0)
    assert list(later.resumed.values()) == [4]
    with resume.saving(later):
        _same(attack.attack_many([target], [0])[0], done)
    assert reported == [(4, 4)]


def _write(tmp_path: Path, key: str) -> Path:
    saver = GroupCheckpoint(tmp_path, key, every=0.0)
    state = {"step": np.array(3, np.int32), "x": np.ones((1, 4), np.float32)}
    saver.save("loop", state, force=True)
    return checkpoint_path(tmp_path, key)


def test_a_checkpoint_of_another_group_or_engine_version_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, "mine")
    assert GroupCheckpoint(tmp_path, "mine").load("loop")["step"] == 3
    path.rename(checkpoint_path(tmp_path, "other"))  # another key's file under this name
    with pytest.warns(UserWarning, match="written for"):
        assert GroupCheckpoint(tmp_path, "other").load("loop") is None
    _write(tmp_path, "mine")
    monkeypatch.setattr(partial, "ENGINE_VERSION", partial.ENGINE_VERSION + 1)
    with pytest.warns(UserWarning, match="engine_version"):
        assert GroupCheckpoint(tmp_path, "mine").states == {}


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_an_unreadable_checkpoint_is_ignored_with_a_warning(tmp_path: Path, damage: str) -> None:
    path = _write(tmp_path, "mine")
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a zip" * 50,
                      "empty": b""}[damage])  # fmt: skip
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        assert GroupCheckpoint(tmp_path, "mine").states == {}


def test_a_state_of_another_shape_is_ignored_with_a_warning(digits, lenet, tmp_path) -> None:
    attack = make_attack("ig", iterations=3, tv=1e-4)
    target = _target(digits, lenet)
    straight = attack.attack_many([target], [0])[0]

    class Wrong(GroupCheckpoint):
        def load(self, tag: str):
            return {"step": np.array(1, np.int32), "x": np.zeros((2, 2), np.float32)}

    with resume.saving(Wrong(tmp_path, "g")), pytest.warns(UserWarning, match="does not fit"):
        _same(attack.attack_many([target], [0])[0], straight)


CONFIG = run_config(
    "partial", images=2, attacks=({"name": "ig", "iterations": ITERATIONS, "tv": 1e-4},),
    parallel_trials=1,
)  # fmt: skip


def _trials(out: Path) -> pd.DataFrame:
    frame = pd.read_csv(out / "trials.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def test_a_run_interrupted_mid_trial_resumes_to_the_uninterrupted_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_config(CONFIG)
    run_benchmark(spec, tmp_path / "straight", progress=False)

    out = tmp_path / "resumed"
    monkeypatch.setattr(partial, "SAVE_SECONDS", 0.0)
    monkeypatch.setattr(Stopping, "at", STOP_AT)
    _stop_once(spec, out, Stopping, monkeypatch)
    monkeypatch.setattr(Stopping, "at", None)
    resumed_at: list[int] = []
    monkeypatch.setattr(Stopping, "progress", lambda self, tag, done, _: resumed_at.append(done))
    run_benchmark(spec, out, progress=False)
    assert resumed_at[0] == STOP_AT  # the first trial's loop went on from its checkpoint
    _same_as_straight(out, tmp_path / "straight")


def _stop_once(spec, out: Path, saver: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs ``spec`` into ``out`` with ``saver`` as the group checkpoint until it interrupts the
    run; it leaves one checkpoint file."""
    monkeypatch.setattr(local, "GroupCheckpoint", saver)
    with pytest.raises(Interrupted):
        run_benchmark(spec, out, progress=False)
    assert len(list((out / "partial").glob("*.npz"))) == 1


def _same_as_straight(out: Path, straight: Path) -> None:
    """The resumed run's rows are the uninterrupted run's, and its checkpoint is gone."""
    pd.testing.assert_frame_equal(_trials(out), _trials(straight))
    assert list((out / "partial").iterdir()) == []  # deleted once stored


# L-BFGS attacks (dlg, idlg): a problem's result is saved as it finishes and not solved again.


class StopAfterSaves(GroupCheckpoint):
    """A checkpoint that interrupts the attack once it has saved ``saves`` results."""

    saves: int | None = None

    def save(self, tag: str, state, *, force: bool) -> None:
        super().save(tag, state, force=force)
        if self.saves is not None and len(self.states) >= self.saves:
            raise Interrupted(tag)


def _targets(digits, lenet, n: int) -> list[AttackTarget]:
    targets = []
    for i in range(n):
        x, y = digits.test.x[i : i + 1], digits.test.y[i : i + 1]
        grads = model_gradients(lenet, tf.constant(x), tf.one_hot(y, 10))
        targets.append(AttackTarget(lenet, tuple(grads), (8, 8, 1), 1, 10))
    return targets


def _solved(monkeypatch: pytest.MonkeyPatch, plan: lanes.Plan) -> list[int]:
    """Runs every solve on ``plan``; returns a list that counts the problems each one starts."""
    started: list[int] = []
    solve = lanes.solve

    def counting(chunk, problems, **kwargs):
        def counted(state, starts, fresh, *rest):
            started.append(int(np.sum(np.asarray(fresh))))
            return chunk(state, starts, fresh, *rest)

        return solve(counted, problems, **{**kwargs, "plan": plan})

    monkeypatch.setattr(lanes, "solve", counting)
    return started


@pytest.mark.parametrize("name", ["dlg", "idlg"])
def test_a_stopped_lbfgs_group_solves_only_its_unfinished_problems_again(
    digits, lenet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    attack = make_attack(name, iterations=30)
    targets = _targets(digits, lenet, 3)
    seeds = [4, 5, 6]
    started = _solved(monkeypatch, lanes.Plan(slots=1, threads=1, tail=0))
    straight = attack.attack_many(targets, seeds)
    assert sum(started) == 3

    first = StopAfterSaves(tmp_path, "group", every=3600.0)
    first.saves = 2  # the first two problems finish and are saved, then a "Ctrl-C"
    with resume.saving(first), pytest.raises(Interrupted):
        attack.attack_many(targets, seeds)
    again = GroupCheckpoint(tmp_path, "group")
    assert len(again.states) == 2 and not again.resumed  # results, not loops in flight
    started.clear()
    with resume.saving(again):
        resumed = attack.attack_many(targets, seeds)
    assert sum(started) == 1  # only the third problem is solved again
    for a, b in zip(resumed, straight, strict=True):
        _same(a, b)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert a.stop_reason == b.stop_reason


def test_wide_lbfgs_programs_neither_save_nor_skip_problems(
    digits, lenet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lane of two slots hands its last rows to width 1 depending on how many problems it
    # holds, so skipping finished ones could move the others' last bits: nothing is saved.
    attack = make_attack("dlg", iterations=10)
    started = _solved(monkeypatch, lanes.Plan(slots=2, threads=1, tail=0))
    saver = GroupCheckpoint(tmp_path, "g", every=0.0)
    with resume.saving(saver):
        attack.attack_many(_targets(digits, lenet, 2), [0, 1])
    assert saver.states == {} and not checkpoint_path(tmp_path, "g").exists()
    assert sum(started) == 2


def test_a_held_result_of_another_shape_is_solved_again_with_a_warning(
    digits, lenet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attack = make_attack("dlg", iterations=10)
    target = _targets(digits, lenet, 1)
    started = _solved(monkeypatch, lanes.Plan(slots=1, threads=1, tail=0))
    straight = attack.attack_many(target, [0])[0]

    class Wrong(GroupCheckpoint):
        def load(self, tag: str):
            return {k: np.zeros(2, np.float32) for k in lanes.RESULT}

    started.clear()
    with resume.saving(Wrong(tmp_path, "g")), pytest.warns(UserWarning, match="does not fit"):
        _same(attack.attack_many(target, [0])[0], straight)
    assert sum(started) == 1


DLG_CONFIG = run_config(
    "partial-dlg", images=3, attacks=({"name": "dlg", "iterations": 20},), parallel_trials=3,
)  # fmt: skip


def test_a_run_stopped_inside_an_lbfgs_group_resumes_to_the_uninterrupted_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_config(DLG_CONFIG)
    run_benchmark(spec, tmp_path / "straight", progress=False)

    out = tmp_path / "resumed"
    monkeypatch.setattr(StopAfterSaves, "saves", 1)
    _stop_once(spec, out, StopAfterSaves, monkeypatch)
    monkeypatch.setattr(StopAfterSaves, "saves", None)
    run_benchmark(spec, out, progress=False)
    _same_as_straight(out, tmp_path / "straight")
