"""The built-in pipelines (`leakbench.run.pipeline`): images here, text in `leakbench.run.text`;
`pipeline_for` gives a run its modality's.

The image pipeline joins the image run's parts: the plan (`leakbench.run.plan`), the group
execution with its judge (`leakbench.run.execute`), the stages of the standard suite
(`leakbench.run.stages`), the epsilon audit (`leakbench.run.epsilon_audit`) and the tables with
their arrays and leakage flags (`leakbench.run.rundir.export_tables`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.attacks import Attack
from leakbench.client.update import check_model
from leakbench.components.forward import examples_interact
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.datasets import Dataset, load_dataset, modality_of
from leakbench.defenses import Defense
from leakbench.outputs.summary import headline_table
from leakbench.run import stages
from leakbench.run.config import RunSpec
from leakbench.run.epsilon_audit import check_audit, run_epsilon_audit, with_audit
from leakbench.run.execute import GroupCache, attack_group, train_one
from leakbench.run.identification import rescore_run_dir
from leakbench.run.pipeline import PIPELINES, GroupResult, Pipeline, Tables, read_audit
from leakbench.run.plan import Training, Trial, attack_groups, plan, plan_training
from leakbench.run.rundir import export_tables
from leakbench.run.sections import ThreatModel
from leakbench.run.store import Store
from leakbench.run.text import TextPipeline

# What names one trial row: its cell, seed, batch and position.
ROW_KEY = ["attack", "attack_params", "defense", "defense_params", "seed", "batch_index",
           "position"]  # fmt: skip


@PIPELINES.register("image")
class ImagePipeline(Pipeline):
    """An image run: a dataset of images and labels, a model of the zoo or a saved one."""

    modality = "image"

    def load(self) -> Dataset:
        return load_dataset(self.spec.dataset, self.spec.image_size)

    def check(self, data: Dataset, trials: list[Trial]) -> None:
        spec = self.spec
        check_against_model(
            data, spec.model, seed=spec.seeds[0], attacks=spec.all_attacks(),
            defenses=spec.defense_grid(), threat=spec.threat_model, batch_size=spec.batch_size,
        )  # fmt: skip
        check_audit(
            spec.epsilon_audit, data, name=spec.dataset, defenses=spec.defense_grid(),
            threat=spec.threat_model, batch_size=spec.batch_size, seed=spec.seeds[0],
        )  # fmt: skip

    def plan(self, data: Dataset) -> list[Trial]:
        return plan(self.spec, data)

    def trainings(self, data: Dataset) -> list[Training]:
        """The utility trainings, refused in one line when the training split cannot hold
        them (`leakbench.client.recipes.TrainingConfig.check_fits`)."""
        spec = self.spec
        if spec.training is not None:
            spec.training.check_fits(
                len(data.train), spec.defense_grid(), f"{spec.dataset}'s training split"
            )
        return plan_training(spec)

    def stages(self, trials: list[Trial], whole: bool) -> list[list[Trial]]:
        return stages.split(self.spec.standard, trials, whole)

    def gate(
        self, data: Dataset, ran: list[Trial], stage: list[Trial], store: Store, out: Path
    ) -> list[Trial]:
        """Which attacks broke ``none`` by the tables' own flags (the trials against ``none``
        are exported first, identification included), which images leaked by their scores
        (`leakbench.run.stages.gate`)."""
        against_none = [t for t in ran if t.defense.name == "none"]
        spec = self.spec
        flagged, _, _ = export_tables(
            store, against_none, [], out, data, threat=spec.threat_model, lpips=spec.lpips,
            success_mse=spec.success_mse, max_accuracy_drop=spec.max_accuracy_drop,
            protocol=spec.protocol,
        )  # fmt: skip
        flags = dict(zip(_row_keys(flagged), flagged["leaked"], strict=True))
        rows = store.rows([t.key for t in ran])
        for row in rows:
            row["leaked"] = flags.get(tuple(str(row[c]) for c in ROW_KEY), float("nan"))
        return stages.gate(ran, stage, rows, spec.success_mse, spec.protocol)

    def groups(self, trials: list[Trial]) -> list[list[Trial]]:
        return attack_groups(trials, self.spec.parallel_trials)

    def cache(
        self, data: Dataset, folder: Path | None = None, progress: bool = False
    ) -> GroupCache:
        return GroupCache(folder=folder, progress=progress)

    def attack(
        self,
        data: Dataset,
        group: list[Trial],
        cache: GroupCache,
        skip: Collection[str] = frozenset(),
        checkpoint: Any = None,
    ) -> GroupResult:
        return attack_group(self.spec, data, group, cache, skip=skip, checkpoint=checkpoint)

    def train(self, data: Dataset, job: Training) -> list[dict[str, Any]]:
        return train_one(self.spec.model, data, job)

    def audit(
        self, data: Dataset, trials: list[Trial], out: Path, progress: bool
    ) -> pd.DataFrame | None:
        if self.spec.epsilon_audit is None:
            return None
        return run_epsilon_audit(self.spec, data, trials, out, progress=progress)

    def export(
        self,
        store: Store,
        trials: list[Trial],
        trainings: list[Training],
        out: Path,
        data: Dataset,
        audit: pd.DataFrame | None = None,
    ) -> Tables:
        spec = self.spec
        return export_tables(
            store, trials, trainings, out, data, audit, threat=spec.threat_model,
            lpips=spec.lpips, success_mse=spec.success_mse,
            max_accuracy_drop=spec.max_accuracy_drop, protocol=spec.protocol,
        )  # fmt: skip

    def summary(self, board: pd.DataFrame) -> str:
        return headline_table(board)

    def rescore(self, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
        """`leakbench.run.identification.rescore_run_dir` (the per-image flags of trials.csv
        too, from the run's arrays), joined with the epsilon audit if the run has one."""
        board = rescore_run_dir(out)
        audit = read_audit(out)
        return (board if audit is None else with_audit(board, audit)), pd.read_csv(
            out / "trials.csv"
        )


def _row_keys(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(str(v) for v in values) for values in frame[ROW_KEY].itertuples(index=False)]


def check_against_model(
    dataset: Dataset,
    model_name: str,
    *,
    seed: int,
    attacks: list[Attack],
    defenses: list[Defense],
    threat: ThreatModel,
    batch_size: int,
) -> None:
    """Refuses ``attacks`` (`RunSpec.all_attacks`), ``defenses`` (`RunSpec.defense_grid`) and
    a ``threat`` model that the run's model ``model_name`` (built on ``dataset`` from the
    first ``seed``) cannot take at clients of ``batch_size`` examples (one line each)."""
    # An attack that cannot attack this model is refused now, not after hours of training.
    probe = build_model(model_name, dataset.input_shape, dataset.num_classes, seed=seed)
    for attack in attacks:
        attack.check_model(probe, dataset.input_shape)
    check_model(probe, defenses, batch_size, threat.local_training(batch_size))
    if threat.bn_statistics_known and not examples_interact(probe):
        raise ConfigError(
            f"threat_model.bn_statistics_known: model {model_name} has no BatchNorm layer"
        )


# The built-in pipelines, registered on import.
BUILT_IN = (ImagePipeline, TextPipeline)


def pipeline_for(spec: RunSpec) -> Pipeline:
    """The pipeline of the run ``spec``: its dataset's modality's (`PIPELINES`)."""
    return PIPELINES.get(modality_of(spec.dataset))(spec)
