"""How a memstream process ends: where it hangs, said on request; never a hung exit.

Kept apart from ``memstream.runtime`` (faust, the stores): the CLI's every command ends
through ``exit_within``, the light ones too.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading

log = logging.getLogger("memstream")


def dump_stacks_on_sigquit() -> None:
    """SIGQUIT writes every thread's Python stack to stderr, as a JVM's thread dump does.

    It works when the event loop is blocked or already closed (a drain or an exit that
    hangs), where the faust worker's own dump (SIGUSR1, its asyncio tasks) cannot run.
    """
    faulthandler.register(signal.SIGQUIT, all_threads=True)


# How long a process may take to exit once its command has ended (a worker's consumers
# committed, its producer flushed): past it, a thread or destructor hangs the exit on
# nothing worth waiting for.
EXIT_GRACE_S = 10.0


def exit_within(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Make sure the process ends with ``code`` within ``grace_s`` from now.

    The interpreter's exit joins every non-daemon thread (a client call stuck in a worker
    thread) and runs destructors; if that hangs, the stacks go to stderr and the process
    exits with the code its command ended with. For a process's ``main`` only: never in
    a process that goes on (a test runner invoking the CLI).
    """

    def force() -> None:
        log.warning("exit took over %g s; forcing it (stacks follow)", grace_s)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(code)

    timer = threading.Timer(grace_s, force)
    timer.daemon = True
    timer.start()
