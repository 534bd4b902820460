"""A ``kill`` stops a command the way Ctrl-C does.

SIGTERM's default action ends a process where it stands: no ``finally`` runs, so a run with
worker processes (`leakbench.run.workers`) leaves them computing for nobody, with their pipes
closed, and whoever waits for the run (the board's coverage driver) never sees their CPU time.
Within `stop_on_signals`, SIGTERM and SIGHUP raise `Stopped` instead: the stack unwinds, the
backend stops its workers, the store is closed, and the command reports the stop and exits
with 128 plus the signal's number, as a shell does for a process the signal killed. A run
stopped this way resumes from its store when it is run again.

A signal whose handler is not the default one is left alone: ``nohup`` ignores SIGHUP, and a
process that embeds leakbench may have handlers of its own. Handlers can be set only in the
main thread; elsewhere nothing changes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt, so that no ``except
    Exception`` on the way up swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGHUP raises `Stopped`; a second one while the
    stack unwinds is ignored, so that the clean-up it started finishes (SIGKILL still ends
    it). The handlers found on entry are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [sig for sig in SIGNALS if signal.getsignal(sig) is signal.SIG_DFL]

    def stop(signum: int, _frame: FrameType | None) -> None:
        for sig in ours:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in ours:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig in ours:
            signal.signal(sig, signal.SIG_DFL)
