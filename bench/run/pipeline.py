"""What a modality plugs into a run: the hooks of one pipeline.

Every run goes through one runner (`leakbench.run.runner`), one set of backends (this process,
local worker processes, Ray), one store, one shard and merge. What depends on what an example
is (how its data loads, what a trial's key holds, how a group of trials is attacked and scored,
how a utility model trains, which tables the run writes and how its leaderboard is printed) is
a `Pipeline`: a class registered in `PIPELINES` under the modality's name (``image``, ``text``,
or a plugin's), built with the run's description and asked for each part in turn. The modality
of a run is its dataset's (`leakbench.datasets.modality_of`).

A pipeline's units are `leakbench.run.plan.Trial` and `leakbench.run.plan.Training`, the same
value objects for every modality: their keys are what the store, shards, merge and the worker
processes agree on. Every hook is a pure function of the run description and its arguments, so
that a worker process or a Ray actor that builds the pipeline from the resolved config computes
the numbers this process computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from leakbench.core.registry import Registry
from leakbench.outputs.leak_flags import CELL_COLUMNS
from leakbench.outputs.tables import write_csv
from leakbench.run.config import RunSpec

# What `Pipeline.attack` returns: the (key, rows) of each stored trial, and each one's arrays
# blob (empty for a modality that keeps none).
GroupResult = tuple[list[tuple[str, list[dict[str, Any]]]], dict[str, bytes]]
# The epsilon audit's table in a run directory (`leakbench.run.epsilon_audit.AUDIT_TABLE`).
AUDIT_TABLE = "epsilon_audit.csv"
# What `Pipeline.export` returns: the trials, utility and leaderboard tables.
Tables = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


class Pipeline:
    """The modality-specific parts of a run, for the run description ``spec``.

    Subclasses implement `load`, `plan`, `groups` and `attack`, and `export` or what the
    default `export` reads (`trial_columns`, `utility_columns` and `leaderboard`, which
    `rescore` recomputes too); the other hooks have the defaults a modality without utility
    trainings, stages or an epsilon audit needs, and `summary` prints any leaderboard.
    """

    modality = ""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec

    def load(self) -> Any:
        """The run's data, loaded once per process and passed to every other hook."""
        raise NotImplementedError

    def check(self, data: Any, trials: list[Any]) -> None:
        """Refuses (`leakbench.core.errors.ConfigError`, one line) what the run's model and
        data cannot take, before anything is written."""

    def plan(self, data: Any) -> list[Any]:
        """Every trial of the run, in execution order (`leakbench.run.plan.plan_batches`)."""
        raise NotImplementedError

    def trainings(self, data: Any) -> list[Any]:
        """The utility trainings (`leakbench.run.plan.Training`); none by default."""
        return []

    def stages(self, trials: list[Any], whole: bool) -> list[list[Any]]:
        """The trials cut into stages run one after the other (``whole``: not a shard); one
        stage by default. A later stage is chosen by `gate` from the stored rows."""
        return [trials]

    def gate(self, data: Any, ran: list[Any], stage: list[Any], store: Any, out: Path) -> list[Any]:
        """The trials of a later ``stage`` worth running, given the stored rows of ``ran``."""
        return stage

    def groups(self, trials: list[Any]) -> list[list[Any]]:
        """The trials cut into the groups attacked and stored together; from the whole plan,
        so that a resumed run and every shard form the groups an uninterrupted run forms."""
        raise NotImplementedError

    def cache(self, data: Any, folder: Path | None = None, progress: bool = False) -> Any:
        """What one process keeps from one group to the next (models, observed updates);
        ``folder`` is the run directory where the process may keep what outlives it (a learned
        attack's inverters), None where it has none (a worker); ``progress`` shows bars."""
        return {}

    def attack(
        self,
        data: Any,
        group: list[Any],
        cache: Any,
        skip: Collection[str] = frozenset(),
        checkpoint: Any = None,
    ) -> GroupResult:
        """Attacks ``group`` whole and returns the rows of its trials not in ``skip``."""
        raise NotImplementedError

    def train(self, data: Any, job: Any) -> list[dict[str, Any]]:
        """The utility row (a one-row list) of the planned training ``job``."""
        raise NotImplementedError

    def audit(self, data: Any, trials: list[Any], out: Path, progress: bool) -> Any:
        """The epsilon audit's table where the config asks for one (None otherwise)."""
        return None

    def export(
        self,
        store: Any,
        trials: list[Any],
        trainings: list[Any],
        out: Path,
        data: Any,
        audit: Any = None,
    ) -> Tables:
        """Writes the run's tables (and report) from the stored rows of ``trials`` and
        ``trainings``, in plan order, into ``out``; returns them. By default: the rows as
        stored in `trial_columns` and `utility_columns`, and `leaderboard` of them."""
        frame = pd.DataFrame(store.rows([t.key for t in trials]), columns=self.trial_columns)
        utility = pd.DataFrame(
            store.rows([t.key for t in trainings], "utility"), columns=self.utility_columns
        )
        board = self.leaderboard(frame, utility, audit)
        write_csv(frame, out / "trials.csv", self.trial_columns)
        write_csv(utility, out / "utility.csv", self.utility_columns)
        write_csv(board, out / "leaderboard.csv", list(board.columns))
        return frame, utility, board

    # The columns of trials.csv and utility.csv (the default `export`'s).
    trial_columns: ClassVar[list[str]] = []
    utility_columns: ClassVar[list[str]] = []

    def leaderboard(self, trials: pd.DataFrame, utility: pd.DataFrame, audit: Any) -> Any:
        """The leaderboard of the run's ``trials`` and ``utility`` tables (and epsilon
        ``audit``, if any): what the default `export` writes and `rescore` recomputes."""
        raise NotImplementedError

    def summary(self, board: pd.DataFrame) -> str:
        """The leaderboard ``board`` as `leakbench run`, ``merge`` and ``rescore`` print it. By
        default `plain_summary`, which reads no column of a particular modality; the image and
        text pipelines print their headline tables (`leakbench.outputs.summary`)."""
        return plain_summary(board)

    def rescore(self, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The leaderboard of the run directory ``out`` recomputed under this version's rules
        from its tables (no attack runs again; the store is not needed) and written over its
        ``leaderboard.csv``, with the trials it was computed from."""
        trials = pd.read_csv(out / "trials.csv")
        utility = pd.read_csv(out / "utility.csv")
        board = self.leaderboard(trials, utility, read_audit(out))
        write_csv(board, out / "leaderboard.csv", list(board.columns))
        return board, trials


PIPELINES: Registry[type[Pipeline]] = Registry("modality")


def plain_summary(board: pd.DataFrame) -> str:
    """A leaderboard of any modality as text: one line per row, its defense and attack
    labelled (`leakbench.outputs.naming`; with several datasets or models, those too), then its
    other columns as the table holds them, numbers to 4 significant digits."""
    from leakbench.outputs.naming import attack_label, defense_label

    if board.empty:
        return "the leaderboard has no rows"
    labels: dict[str, list[str]] = {}
    for column in ("dataset", "model"):
        if column in board and board[column].nunique() > 1:
            labels[column] = board[column].astype(str).tolist()
    for kind, label in (("defense", defense_label), ("attack", attack_label)):
        if {kind, f"{kind}_params"} <= set(board):
            pairs = zip(board[kind], board[f"{kind}_params"], strict=True)
            labels[kind] = [label(str(name), str(params)) for name, params in pairs]
    shown = board.drop(columns=[c for c in CELL_COLUMNS if c in board])
    for at, (column, values) in enumerate(labels.items()):
        shown.insert(at, column, values)
    return shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def read_audit(out: Path) -> pd.DataFrame | None:
    """The run's ``epsilon_audit.csv``, or None if it has none."""
    path = Path(out) / AUDIT_TABLE
    return pd.read_csv(path) if path.is_file() else None


@dataclasses.dataclass(frozen=True)
class Work:
    """What a backend is asked to run: the ``trainings`` still to do and the attack ``groups``
    with a trial whose key is not in ``done`` (such a group is attacked whole, and only its
    missing trials are stored), by ``pipeline`` on its loaded ``data``; a backend whose workers
    live in other processes builds both there instead."""

    pipeline: Pipeline
    data: Any
    trainings: list[Any]
    groups: list[list[Any]]
    done: Collection[str]
    # Which stage of the run the groups are (``"stage 2/4"``; empty for a run of one stage),
    # named in the progress bars (`label`).
    stage: str = ""


def trials_label(stage: str) -> str:
    """What a trials progress bar says after the run's name: ``"stage 2/4 (idlg) trials"``, or
    ``"trials"`` for a run of one stage."""
    return f"{stage} trials" if stage else "trials"
