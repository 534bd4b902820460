"""Local worker processes: ``leakbench run --workers N`` (the local backend with N > 1).

TensorFlow runs these small models on little more than one core, so a run on a machine with
several cores hands its units (the trainings, then the attack groups) to N worker processes
instead of running them one after the other in this process. Each worker is a fresh
interpreter (the ``spawn`` start method: a forked TensorFlow is not safe) that parses the
resolved config, loads the dataset and plans the run itself (`leakbench.run.dispatch.WorkerState`),
and keeps TensorFlow's default thread pools, as the in-process backend and the Ray actors do,
so the tables are the in-process run's to the last bit. This process stays the only writer of
the store: it commits each result as it arrives, and a run interrupted or killed resumes from
what was committed.

A worker that raises a user error (`leakbench.core.errors.LeakbenchError`) stops the run with that
error; a worker that dies stops it with a line naming the unit it was running.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leakbench.core.errors import LeakbenchError

if TYPE_CHECKING:
    from leakbench.run.dispatch import Affinity, Unit
    from leakbench.run.pipeline import Work
    from leakbench.run.store import Store

# Units of work per worker below which starting the workers (each imports TensorFlow, several
# seconds, about what 25 small units take) costs more than it saves; `auto_workers` counts them.
UNITS_PER_WORKER = 25
# The most workers `--workers auto` starts: each holds a TensorFlow process (about 1 GB).
MAX_AUTO_WORKERS = 4
# Seconds `WorkerPool.close` gives the workers to finish their unit and stop on their own.
STOP_PATIENCE = 30.0


def auto_workers(units: int, cpus: int | None = None) -> int:
    """The worker count of ``--workers auto`` for ``units`` units of work: one per CPU (at most
    `MAX_AUTO_WORKERS`), and 1 (this process, no worker started) when there are fewer than
    `UNITS_PER_WORKER` units for each."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_AUTO_WORKERS, units // UNITS_PER_WORKER))


def _serve(
    conn: multiprocessing.connection.Connection, config_text: str, folder: str | None = None
) -> None:
    """A worker's loop: runs each ``(method, args)`` it receives and sends back ``("ok",
    result)``, ``("user", error)`` for a user error or ``("error", traceback)``; stops on None.
    """
    # Ctrl-C reaches the whole process group: the driver handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # TensorFlow is imported before any module that imports it (this module imports none), so
    # its start-up lines stay out of the driver's terminal, as in the CLI's own process.
    from leakbench.core.environment import import_tensorflow_quietly

    import_tensorflow_quietly()
    from leakbench.run.dispatch import WorkerState

    state = WorkerState(config_text, Path(folder) if folder is not None else None)
    while (message := conn.recv()) is not None:
        method, args = message
        try:
            conn.send(("ok", getattr(state, method)(*args)))
        except LeakbenchError as err:
            conn.send(("user", err))
        except Exception:  # noqa: BLE001 - reported to the driver, which stops the run
            conn.send(("error", traceback.format_exc()))


class WorkerPool:
    """Up to ``workers`` local processes running the units of a run (see the module
    docstring). The processes outlive one `run`: the stages of a run (`leakbench.run.stages`)
    reuse them, with the models, observed gradients and compiled programs they hold, until
    `close`."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._config: tuple[str, str | None] | None = None
        self._conns: list[multiprocessing.connection.Connection] = []
        self._processes: list[Any] = []
        self._affinity: Affinity | None = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(patience=STOP_PATIENCE if exc_info[0] is None else 0.0)

    def run(self, work: Work, store: Store, progress: bool) -> None:
        """Runs the trainings of ``work``, then its groups with a trial not yet done, and stores
        each result as it arrives."""
        from leakbench.run.dispatch import attack_units, run_units, training_units
        from leakbench.run.plan import pending_groups

        spec, done = work.pipeline.spec, work.done
        trainings = training_units(work.trainings)
        groups = attack_units(pending_groups(work.groups, set(done)), done)
        count = min(self.workers, max(len(trainings), len(groups)))
        if count == 0:
            return
        self._start(spec.to_toml(), count, str(store.path.parent))
        run_units(
            spec.name,
            trainings,
            groups,
            store,
            progress,
            lambda units, on_result, bar: self._dispatch(
                self._conns, self._processes, units, on_result, bar, self._affinity
            ),
            stage=work.stage,
        )

    def pids(self) -> list[int]:
        """The process ids of the workers running now."""
        return [process.pid for process in self._processes]

    def _start(self, config_text: str, count: int, folder: str | None = None) -> None:
        """At least ``count`` workers of ``config_text`` running (those of another config or
        run directory ``folder`` stopped first)."""
        if self._config != (config_text, folder):
            self.close()
            self._config = (config_text, folder)
            self._affinity = None
        context = multiprocessing.get_context("spawn")
        while len(self._processes) < count:
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, config_text, folder), daemon=True)
            process.start()
            child.close()
            self._conns.append(parent)
            self._processes.append(process)
        if self._affinity is None:
            from leakbench.run.dispatch import Affinity

            self._affinity = Affinity.fresh(len(self._processes))

    def close(self, patience: float = STOP_PATIENCE) -> None:
        """Stops the workers: asked to, then terminated if they have not stopped within
        ``patience`` seconds. A worker finishes its unit before it reads the request, so a run
        that stops on an error or a signal passes 0: what they compute now would be thrown away.
        """
        conns, processes = self._conns, self._processes
        self._conns, self._processes, self._config, self._affinity = [], [], None, None
        try:
            for conn, process in zip(conns, processes, strict=True):
                if process.is_alive():
                    try:
                        conn.send(None)
                    except OSError:  # the worker is gone already
                        pass
            for process in processes:
                process.join(timeout=patience)
        finally:
            for process in processes:
                if process.is_alive():
                    process.terminate()
                    process.join()
            for conn in conns:
                conn.close()

    @staticmethod
    def _dispatch(
        conns: list[multiprocessing.connection.Connection],
        processes: list[Any],
        units: list[Unit],
        on_result: Callable[[Unit, Any], None],
        bar: Any,
        affinity: Affinity | None = None,
    ) -> None:
        """Keeps every worker busy with one unit (in `leakbench.run.dispatch.Scheduler`'s order,
        with what each worker holds from earlier units in ``affinity``) until ``units`` are
        done, passes each result to ``on_result`` as it arrives, and closes ``bar``."""
        from leakbench.run.dispatch import Scheduler

        scheduler = Scheduler(units, len(conns), affinity)
        idle = list(range(len(conns)))
        running: dict[int, Unit] = {}
        try:
            while scheduler or running:
                while idle and scheduler:
                    i = idle.pop(0)
                    unit = scheduler.take(i)
                    try:
                        conns[i].send((unit.method, unit.args))
                    except OSError:  # the worker is gone (its end of the pipe is closed)
                        raise _died(processes[i], unit) from None
                    running[i] = unit
                ready = multiprocessing.connection.wait([conns[i] for i in running])
                for conn in ready:
                    # `wait` is typed to return sockets and ints too: find which pipe this is.
                    i = next(j for j in running if conns[j] is conn)
                    unit = running.pop(i)
                    on_result(unit, _received(conns[i], processes[i], unit))
                    scheduler.done(i)
                    idle.append(i)
                    bar.update(unit.count)
        finally:
            bar.close()


def _received(conn: multiprocessing.connection.Connection, process: Any, unit: Unit) -> Any:
    """The result a worker sent for ``unit``; its user error raised here as is."""
    try:
        status, payload = conn.recv()
    except EOFError:
        raise _died(process, unit) from None
    if status == "user":
        raise payload
    if status == "error":
        raise RuntimeError(f"the worker process running {unit.label} failed:\n{payload}")
    return payload


def _died(process: Any, unit: Unit) -> RuntimeError:
    process.join(timeout=5)
    return RuntimeError(
        f"the worker process running {unit.label} died (exit code {process.exitcode}); the "
        "work finished before is stored: rerun the command to resume"
    )
