"""A memstream process says where it hangs and never hangs its exit
(``memstream.process_exit``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time


def python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_an_exit_that_a_stuck_thread_would_hang_ends_with_the_workers_code() -> None:
    proc = python(
        """
        import threading
        from memstream.process_exit import exit_within

        def a_client_call_that_never_returns():
            threading.Event().wait()

        threading.Thread(target=a_client_call_that_never_returns).start()
        exit_within(3, grace_s=0.5)
        """
    )
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert time.monotonic() - started < 30
    assert "forcing it" in err
    assert "a_client_call_that_never_returns" in err  # the stuck thread's stack


def test_an_exit_that_does_not_hang_is_left_alone() -> None:
    proc = python(
        """
        import sys
        from memstream.process_exit import exit_within

        exit_within(3, grace_s=30)
        sys.exit(0)
        """
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "forcing it" not in err


def test_sigquit_writes_every_threads_stack_and_the_process_goes_on() -> None:
    proc = python(
        """
        import threading, time
        from memstream.process_exit import dump_stacks_on_sigquit

        dump_stacks_on_sigquit()
        def waiting_on_a_reply():
            threading.Event().wait()
        threading.Thread(target=waiting_on_a_reply, daemon=True).start()
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGQUIT)
        time.sleep(1.0)
        assert proc.poll() is None  # a dump, not an exit
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "waiting_on_a_reply" in err
    assert "most recent call first" in err
