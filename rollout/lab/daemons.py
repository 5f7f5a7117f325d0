"""The lab's own daemons on this host (the control plane, the image registry): start one in a
session of its own and wait until it answers, ask whether it answers over HTTP, stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from rollout.lab.nodes import process_alive

# After SIGKILL, how long a stop still waits for the process to be gone.
KILL_WAIT_S = 5.0


def start_daemon(
    argv: Sequence[str],
    log_path: Path,
    pid_path: Path,
    answers: Callable[[], bool],
    timeout_s: float,
    poll_s: float = 0.1,
) -> tuple[subprocess.Popen[bytes], bool]:
    """Start `argv` in a session of its own, its output appended to `log_path` and its pid
    written to `pid_path`; wait until `answers()`. Returns the process and whether it
    answered; one that did not has exited (its returncode is set) or ran out of time."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_path.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process, False
        if answers():
            return process, True
        time.sleep(poll_s)
    return process, False


def http_answers(url: str) -> bool:
    """Whether GET `url` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_daemon(pid: int, timeout_s: float, poll_s: float = 0.05) -> None:
    """SIGTERM, then SIGKILL once `timeout_s` has passed; returns when it is gone (or
    KILL_WAIT_S after the SIGKILL)."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if process_alive(pid):
        os.kill(pid, signal.SIGKILL)
        while process_alive(pid) and time.monotonic() < deadline + KILL_WAIT_S:
            time.sleep(poll_s)
