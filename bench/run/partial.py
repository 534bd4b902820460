"""Checkpoints of a trial group still in flight: ``RUN/partial/<key>.npz``.

A run stores a trial group's results in one transaction when the group finishes
(`leakbench.run.store`); a group interrupted before that is attacked again. An ``ig`` trial at
224x224 on a CPU takes hours, so while a group is attacked its in-flight optimisation loops
(`leakbench.attacks.engine.resume`: the dummy images, Adam's moments, the iteration counter,
the best iterate so far and the loss history, per loop; for an L-BFGS attack, each finished
problem's result, `leakbench.attacks.engine.lanes`) are written to
``partial/<key>.npz`` in the run directory, where ``key`` is the trial key
(`leakbench.run.plan.Trial.key`, which hashes the trial with the engine version) for a group of
one trial, or a hash of the group's trial keys. The file is written atomically (a temporary
file in the same folder, then ``os.replace``) at most every `SAVE_SECONDS` seconds, and always
when a loop finishes; the same group started again reads it back and continues each loop where
it stopped, computing the numbers the uninterrupted run computes, bit for bit. A file of another
key or engine version, or one that cannot be read (truncated, corrupt), is ignored with a
warning. The backend deletes the file once the group's results are stored (`discard`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from leakbench.core.canonical import stable_hash
from leakbench.core.versions import ENGINE_VERSION
from leakbench.run.plan import Trial

FOLDER = "partial"
# The interval between two writes of a group's checkpoint, in seconds (a loop's end is
# always written).
SAVE_SECONDS = 60.0
_META = "__meta__"


def group_key(group: list[Trial]) -> str:
    """The name of a group's checkpoint: its trial's key, or a hash of its trials' keys."""
    if len(group) == 1:
        return group[0].key
    return stable_hash([t.key for t in group], 32)


def checkpoint_path(run_dir: Path, key: str) -> Path:
    """Where the checkpoint of the group of ``key`` (`group_key`) lies in ``run_dir``."""
    return Path(run_dir) / FOLDER / f"{key}.npz"


def discard(run_dir: Path, group: list[Trial]) -> None:
    """Deletes the checkpoint of a group whose results are stored."""
    checkpoint_path(run_dir, group_key(group)).unlink(missing_ok=True)


class GroupCheckpoint:
    """The `leakbench.attacks.engine.resume.Saver` of one group in ``run_dir`` (``key``, its
    `group_key`): the loop states
    it read back or was given, written together as one file; with ``progress``, a bar of the
    current loop's iterations.

    Args:
        run_dir: The run directory.
        key: The group's `group_key`.
        every: Seconds between two writes (None: `SAVE_SECONDS`); 0 writes after every chunk.
        progress: Show the iterations of each loop.
    """

    def __init__(
        self, run_dir: Path, key: str, *, every: float | None = None,
        progress: bool = False,
    ) -> None:  # fmt: skip
        self.path = checkpoint_path(run_dir, key)
        self.key = key
        self.every = SAVE_SECONDS if every is None else every
        self.show = progress
        self.states: dict[str, dict[str, np.ndarray]] = self._read()
        self.resumed: dict[str, int] = {t: int(s["step"]) for t, s in self.states.items()
                                        if "step" in s}  # fmt: skip
        self._written = time.monotonic()
        self._bar: Any = None
        self._bar_tag = ""

    def _meta(self) -> dict[str, Any]:
        return {"key": self.key, "engine_version": ENGINE_VERSION}

    def _read(self) -> dict[str, dict[str, np.ndarray]]:
        """The states in the file, or none (with a warning) when it is not this group's."""
        if not self.path.exists():
            return {}
        try:
            with np.load(self.path, allow_pickle=False) as held:
                arrays = {name: held[name] for name in held.files}
            meta = json.loads(bytes(arrays.pop(_META)).decode())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            warnings.warn(f"ignoring unreadable checkpoint {self.path} ({err})", stacklevel=3)
            return {}
        if meta != self._meta():
            warnings.warn(
                f"ignoring checkpoint {self.path}: it was written for {meta}, not {self._meta()}",
                stacklevel=3,
            )
            return {}
        states: dict[str, dict[str, np.ndarray]] = {}
        for name, value in arrays.items():
            tag, _, field = name.partition("/")
            states.setdefault(tag, {})[field] = value
        return states

    def load(self, tag: str) -> Mapping[str, np.ndarray] | None:
        held = self.states.get(tag)
        if held is not None and self.show and "step" in held:
            tqdm.write(f"resuming loop {tag} of {self.path.name} at iteration {int(held['step'])}")
        return held

    def save(self, tag: str, state: Mapping[str, np.ndarray], *, force: bool) -> None:
        self.states[tag] = dict(state)
        if force or time.monotonic() - self._written >= self.every:
            self.write()

    def write(self) -> None:
        """Writes every held state to the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {f"{tag}/{field}": value for tag, state in self.states.items()
                                  for field, value in state.items()}  # fmt: skip
        arrays[_META] = np.frombuffer(json.dumps(self._meta()).encode(), np.uint8)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                np.savez(out, **arrays)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._written = time.monotonic()

    def progress(self, tag: str, done: int, total: int) -> None:
        if not self.show:
            return
        if tag != self._bar_tag:
            self.close()
            self._bar = tqdm(total=total, initial=done, desc="  iterations", unit="it",
                             leave=False)  # fmt: skip
            self._bar_tag = tag
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        """Closes the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar, self._bar_tag = None, ""
