"""The lab's daemons on this host: started in a session of their own, waited for, stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rollout.lab.daemons import start_daemon, stop_daemon
from rollout.lab.nodes import process_alive


def test_a_daemon_that_exits_is_not_waited_for(tmp_path: Path) -> None:
    started = time.monotonic()
    process, answered = start_daemon(
        ["sh", "-c", "echo no config; exit 3"],
        tmp_path / "log",
        tmp_path / "pid",
        lambda: False,
        timeout_s=30,
        poll_s=0.01,
    )
    assert (answered, process.returncode) == (False, 3)
    assert time.monotonic() - started < 10
    assert (tmp_path / "log").read_text() == "no config\n"
    assert (tmp_path / "pid").read_text() == f"{process.pid}\n"


def test_one_that_answers_runs_on_in_a_session_of_its_own(tmp_path: Path) -> None:
    marker = tmp_path / "up"
    process, answered = start_daemon(
        ["sh", "-c", f"touch {marker}; exec sleep 60"],
        tmp_path / "log",
        tmp_path / "pid",
        marker.exists,
        timeout_s=30,
        poll_s=0.01,
    )
    try:
        assert answered and process.poll() is None
        assert os.getsid(process.pid) == process.pid
    finally:
        stop_daemon(process.pid, timeout_s=5)
        process.wait()


def test_one_that_never_answers_runs_out_of_time(tmp_path: Path) -> None:
    process, answered = start_daemon(
        ["sleep", "60"], tmp_path / "log", tmp_path / "pid", lambda: False, 0.2, 0.01
    )
    try:
        assert not answered and process.poll() is None
    finally:
        stop_daemon(process.pid, timeout_s=5)
        process.wait()


def test_a_daemon_deaf_to_sigterm_is_killed(tmp_path: Path) -> None:
    deaf = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"1\n"
    reaper = time.monotonic()
    stop_daemon(process.pid, timeout_s=0.3)
    took = time.monotonic() - reaper
    # stop_daemon reaps its own children (process_alive), so Popen knows no exit status
    assert not process_alive(process.pid)
    assert 0.3 <= took < 5, "SIGTERM was ignored for the whole timeout, then SIGKILL"
    process.wait()
