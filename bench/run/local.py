"""The local backend: a run's units on this machine, in this process or in local worker
processes (`leakbench.run.workers`)."""

from __future__ import annotations

from tqdm.auto import tqdm

from leakbench.core.errors import ConfigError
from leakbench.run.partial import GroupCheckpoint, discard, group_key
from leakbench.run.pipeline import Work, trials_label
from leakbench.run.plan import pending_groups
from leakbench.run.store import Store
from leakbench.run.workers import WorkerPool, auto_workers


class LocalBackend:
    """Runs every unit on this machine: in this process, one after the other, or with
    ``workers`` above 1 (or "auto", `leakbench.run.workers.auto_workers`) in as many worker
    processes (`leakbench.run.workers`), with the same tables."""

    def __init__(self, address: str | None = None, workers: int | str = 1) -> None:
        if address is not None:
            raise ConfigError("--address needs --backend ray (the local backend runs in-process)")
        self.workers = workers
        # Started on the first run with enough work, kept for the later stages of the run.
        self._pool: WorkerPool | None = None

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.__exit__(*exc_info)
            self._pool = None

    def run(self, work: Work, store: Store, progress: bool) -> None:
        pipeline, data, trainings, done = work.pipeline, work.data, work.trainings, work.done
        name = pipeline.spec.name
        groups = pending_groups(work.groups, set(done))
        workers = self.workers
        if workers == "auto":
            workers = auto_workers(max(len(trainings), len(groups)))
        if self._pool is not None or (isinstance(workers, int) and workers > 1):
            if self._pool is None:
                self._pool = WorkerPool(int(workers))
            self._pool.run(work, store, progress)
            return
        if trainings:
            bar = tqdm(total=len(trainings), desc=f"{name} training", unit="model",
                       disable=not progress)  # fmt: skip
            with bar:
                for job in trainings:
                    store.add(job.key, pipeline.train(data, job), "utility")
                    bar.update(1)
        if not groups:
            return
        cache = pipeline.cache(data, store.path.parent, progress)
        total = sum(t.key not in done for g in groups for t in g)
        with tqdm(total=total, desc=f"{name} {trials_label(work.stage)}", unit="trial",
                  disable=not progress) as bar:  # fmt: skip
            for group in groups:
                # In-flight loops are checkpointed in the run directory (`leakbench.run.partial`).
                checkpoint = GroupCheckpoint(store.path.parent, group_key(group), progress=progress)
                try:
                    items, arrays = pipeline.attack(data, group, cache, done, checkpoint)
                finally:
                    checkpoint.close()
                store.add_many(items, arrays=arrays)
                discard(store.path.parent, group)
                bar.update(len(items))
