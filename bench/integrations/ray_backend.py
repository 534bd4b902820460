"""The Ray backend: ``leakbench run --backend ray [--address ADDR]`` (the ``ray`` extra).

Long-lived Ray actors, one CPU each and one TensorFlow process each, run whole units of work:
the utility trainings and the attack groups that `leakbench.run.plan.attack_groups` cuts, the
very groups of a local run, attacked by the same `leakbench.run.execute.attack_group`, so the tables
are the local backend's to the last bit. The driver (the ``leakbench run`` process) is the only
writer of the store: it hands one unit at a time to each idle actor and commits each result in
one transaction as it arrives (results come back in any order; the exported tables follow the
plan's order, so they do not depend on it).

What the actors receive is picklable text, never a Keras model or a TensorFlow object: the
resolved config (``spec.to_toml()``, parsed again by each actor) and the trial keys of a group,
which each actor looks up in its own `leakbench.run.plan.plan`. An actor builds the attacked model
of a seed once and keeps it, with the observed gradients, in a `leakbench.run.execute.GroupCache`
while the driver keeps giving it groups of that seed (groups are handed out seed-first).

Trainings run on the actors too, before the attacks and one per actor at a time: each is a
sequential job of its own (no state shared with the attacks), so with several actors they run
in parallel instead of serially on the driver, and the driver stays a light scheduler.

Failures: an actor process that dies (killed, out of memory, its node lost) takes with it only
the unit it was running, which was not stored. Ray restarts the actor (``max_restarts=-1``: a
fresh process that parses the config and loads the dataset again) and runs the same unit on it
again (``max_task_retries``), so the driver sees the result as if nothing had happened. A unit
that kills its worker ``MAX_TASK_RETRIES + 1`` times stops the run with an error; everything
finished before is stored, and rerunning the command resumes. If the driver dies, its actors
end with it and the rerun resumes the same way.

Without ``--address`` the driver starts a private Ray instance for the run (never one named by
``RAY_ADDRESS``), bound to the loopback interface (127.0.0.1), without a dashboard, with
``os.cpu_count()`` CPUs, and only when there is work; it stops it afterwards. With ``--address``
it joins a running cluster (``ray start --head`` on one machine, ``ray start --address
HEAD:PORT`` on the others) before anything is written, so a wrong or refusing address leaves
no run directory behind; every node needs the same leakbench (and plugins) installed and the
dataset under the same path, and a cluster with Ray's token authentication needs
``RAY_AUTH_MODE=token`` in the driver's environment, as any Ray driver does. A process that is
already connected to Ray (``ray.init`` called by a script) uses that connection.

Each actor's TensorFlow keeps its default thread pools, as the local backend's does: fewer
threads would change the order of floating-point sums, and so the last bits of the results.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.run.dispatch import (
    Affinity,
    Scheduler,
    Unit,
    WorkerState,
    attack_units,
    run_units,
    training_units,
)
from leakbench.run.pipeline import GroupResult, Work
from leakbench.run.plan import pending_groups
from leakbench.run.store import Store

RAY_MISSING = "--backend ray needs the ray extra: pip install 'leakbench[ray]'"
# How often a unit whose worker died is run again on the restarted worker.
MAX_TASK_RETRIES = 3
# CPUs of the private local instance; None: os.cpu_count(). Tests pin it.
LOCAL_NUM_CPUS: int | None = None
# Seconds to wait for a TCP answer at --address before calling it unreachable (ray.init itself
# retries for many minutes).
CONNECT_TIMEOUT = 10.0
# Ray keeps a single-node instance on the loopback interface when this is "0" (its default on
# Windows and macOS); on Linux it would listen on the machine's network address.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Test hook: a file path; the first actor to create that file exits at once, as a worker killed
# in the middle of a group would (tests/test_ray.py).
CRASH_ONCE_ENV = "LEAKBENCH_TEST_RAY_CRASH_ONCE"
_CLIENT_SCHEME = "ray://"


def _import_ray() -> Any:
    """The ``ray`` module, or the one-line `ConfigError` that names the extra."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def check_address(address: str) -> str:
    """Refuses an ``--address`` that is malformed or where nothing answers, in seconds.

    Ray's own ``auto`` (the cluster last started on this machine) is not taken: a stale record
    of a stopped cluster would have ray.init retry for minutes.

    Returns:
        The address's host.
    """
    host_port = address.removeprefix(_CLIENT_SCHEME)
    host, sep, port = host_port.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal
    if not sep or not host or "/" in host_port or not port.isdigit():
        raise ConfigError(
            "--address must be HOST:PORT (the head's address that `ray start --head` prints, "
            f"e.g. 10.0.0.5:6379) or ray://HOST:PORT (Ray Client), got {address!r}"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise ConfigError(
            f"--address {address}: no Ray cluster answers ({reason}); start one with "
            "`ray start --head`, or fix the address"
        ) from None
    return host


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


class RayCluster:
    """Runs a benchmark's trainings and attack groups on Ray actors (see the module docstring).

    Args:
        address: A running cluster's address, ``HOST:PORT`` (its head) or ``ray://HOST:PORT``
            (its Ray Client server); None starts a private local instance on 127.0.0.1.

    Raises:
        ConfigError: Ray is not installed, or ``address`` is malformed or unreachable.
    """

    def __init__(self, address: str | None = None) -> None:
        # find_spec, not import: ray takes seconds to import, and a finished run that is
        # resumed never needs it.
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(RAY_MISSING)
        self.address = address
        # A cluster that answers on a loopback address listens there only (Ray would otherwise
        # swap the address for the machine's network address): join it as a loopback node.
        self._loopback = (
            address is not None
            and _is_loopback(check_address(address))
            and not address.startswith(_CLIENT_SCHEME)
        )
        self._joined = False
        # Kept from the first run with work to the end of the context, so that the stages of a
        # run (`leakbench.run.stages`) reuse the actors and what they hold.
        self._actors_of: tuple[str, list[Any]] | None = None
        self._affinity: Affinity | None = None

    def __enter__(self) -> RayCluster:
        """Joins the cluster at ``address`` now, so that a cluster that refuses this process
        is reported before the run directory is written (a private instance starts later,
        only if there is work)."""
        if self.address is not None:
            self._joined = self._connect(_import_ray())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._actors_of is not None:
            ray = _import_ray()
            for actor in self._actors_of[1]:
                ray.kill(actor)
            self._actors_of, self._affinity = None, None
        if self._joined:
            self._joined = False
            _import_ray().shutdown()

    def run(self, work: Work, store: Store, progress: bool) -> None:
        """Runs the trainings of ``work``, then its groups with a trial not yet done (whole;
        only the missing trials are stored), and stores each result as it arrives. Each actor
        loads the dataset itself; the actors stay for the next `run` until the context ends."""
        spec, trainings, done = work.pipeline.spec, work.trainings, work.done
        groups = pending_groups(work.groups, set(done))
        if not trainings and not groups:
            return  # a finished run resumed: no cluster needed
        ray = _import_ray()
        if not ray.is_initialized():
            self._joined = self._connect(ray) or self._joined
        actors = self._actors(ray, spec.to_toml(), max(len(trainings), len(groups)))
        affinity = self._affinity
        run_units(
            spec.name,
            training_units(trainings),
            attack_units(groups, done),
            store,
            progress,
            lambda units, on_result, bar: self._dispatch(
                ray, actors, units, on_result, bar, affinity
            ),
            stage=work.stage,
        )

    def _connect(self, ray: Any) -> bool:
        """Connects this process to Ray; True if it did so (and so disconnects afterwards)."""
        if ray.is_initialized():
            if self.address is not None:
                raise ConfigError(
                    f"--address {self.address}: this process is already connected to Ray; "
                    "leave --address out to use that connection"
                )
            return False
        options = {
            "include_dashboard": False,
            # Workers' output (TensorFlow's start-up lines) would break the progress bars; it
            # stays in the session's log files.
            "log_to_driver": False,
            "logging_level": logging.ERROR,
        }
        if self.address is None:
            _start_loopback(ray, LOCAL_NUM_CPUS or os.cpu_count() or 1, options)
            return True
        said: list[str] = []
        try:
            # Ray's native code logs every failed attempt on stderr; the reason goes into the
            # one-line error instead.
            with _stderr_into(said):
                with _on_loopback(ray) if self._loopback else contextlib.nullcontext():
                    ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError) as err:
            hint = ""
            if "InvalidAuthToken" in "".join(said):
                hint = (
                    "; the cluster asks for its token: set RAY_AUTH_MODE=token, with the token "
                    "in RAY_AUTH_TOKEN or ~/.ray/auth_token"
                )
            raise ConfigError(
                f"--address {self.address}: cannot join the Ray cluster ({_first_line(err)})" + hint
            ) from None
        return True

    def _actors(self, ray: Any, config_text: str, units: int) -> list[Any]:
        """One actor per CPU of the cluster, at most one per unit of work, started once per
        config (the actors of an earlier run of this context, and more if there is more work)."""
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise ConfigError(
                f"--address {self.address}: the Ray cluster has no CPUs for the actors; "
                "add a node with `ray start --address ...`"
            )
        text, crash = config_text, os.environ.get(CRASH_ONCE_ENV)
        if self._actors_of is not None and self._actors_of[0] != text:
            for actor in self._actors_of[1]:
                ray.kill(actor)
            self._actors_of = None
        if self._actors_of is None:
            self._actors_of, self._affinity = (text, []), Affinity.fresh(0)
        actors = self._actors_of[1]
        worker = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=MAX_TASK_RETRIES)(_Worker)
        while len(actors) < min(cpus, units):
            actors.append(worker.remote(text, crash))
        return actors

    def _dispatch(
        self,
        ray: Any,
        actors: list[Any],
        units: list[Unit],
        on_result: Callable[[Unit, Any], None],
        bar: Any,
        affinity: Affinity | None = None,
    ) -> None:
        """Keeps every actor busy with one unit (in `leakbench.run.dispatch.Scheduler`'s order,
        with what each actor holds from earlier units in ``affinity``) until ``units`` are done,
        passes each result to ``on_result`` (which stores it) as it arrives, and closes
        ``bar``."""
        scheduler = Scheduler(units, len(actors), affinity)
        idle = list(range(len(actors)))
        running: dict[Any, tuple[int, Unit]] = {}
        try:
            while scheduler or running:
                while idle and scheduler:
                    i = idle.pop(0)
                    unit = scheduler.take(i)
                    ref = getattr(actors[i], unit.method).remote(*unit.args)
                    running[ref] = (i, unit)
                ready, _ = ray.wait(list(running), num_returns=1)
                i, unit = running.pop(ready[0])
                scheduler.done(i)
                idle.append(i)
                on_result(unit, _result(ray, ready[0], unit))
                bar.update(unit.count)
        finally:
            bar.close()


@contextlib.contextmanager
def _on_loopback(ray: Any) -> Iterator[None]:
    """While in this block, ``ray.init`` gives this process's node the loopback address.

    Ray picks the machine's network address for a node (and swaps a loopback ``address`` for
    it) unless multi-node clusters are disabled, as on Windows and macOS. That switch is read
    from the environment when ray is imported, so it is set in both places; the processes
    started meanwhile keep the loopback address afterwards.
    """
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    saved_env = os.environ.get(_LOOPBACK_ENV)
    saved_flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_LOOPBACK_ENV] = "0"
    if constants is not None and saved_flag is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if constants is not None and saved_flag is not None:
            constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_LOOPBACK_ENV, None)
        else:
            os.environ[_LOOPBACK_ENV] = saved_env


@contextlib.contextmanager
def _stderr_into(lines: list[str]) -> Iterator[None]:
    """Sends what is written to file descriptor 2 in this block to ``lines`` instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines.extend(held.read().decode(errors="replace").splitlines())


def _start_loopback(ray: Any, num_cpus: int, options: dict[str, Any]) -> None:
    """Starts a private single-node Ray instance whose servers listen on 127.0.0.1 only."""
    with _on_loopback(ray):
        # "local": a new instance even where RAY_ADDRESS or a `ray start` cluster would be joined.
        ray.init("local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **options)
    node = ray.util.get_node_ip_address()
    if node != "127.0.0.1":
        ray.shutdown()
        raise RuntimeError(
            f"this Ray version started its local instance on {node}, not on 127.0.0.1; start "
            "one with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head` and pass --address"
        )


def _result(ray: Any, ref: Any, unit: Unit) -> Any:
    """The value of a finished unit; a user error raised on a worker is raised here as is."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, LeakbenchError):
            raise err.cause from None
        raise
    except ray.exceptions.RayActorError as err:
        raise RuntimeError(
            f"the Ray worker running {unit.label} died {MAX_TASK_RETRIES + 1} times (or could "
            "not start); the work finished before is stored: rerun the command to resume. "
            f"Ray: {_first_line(err)}"
        ) from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class _Worker(WorkerState):
    """A Ray actor: one TensorFlow process that trains and attacks what the driver sends.

    Everything is loaded on the first call, so a restarted actor (a new process) reloads it.
    """

    def __init__(self, config_text: str, crash_once: str | None = None) -> None:
        super().__init__(config_text)
        self._crash_once = crash_once

    def attack(self, keys: tuple[str, ...], skip: tuple[str, ...]) -> GroupResult:
        """`WorkerState.attack`; the test hook first."""
        if self._crash_once:
            try:
                os.close(os.open(self._crash_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return super().attack(keys, skip)
