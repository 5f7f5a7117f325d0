"""The command line a reviewer and a CI job reach for: --color under a terminal, -o yaml,
a plan read from standard input, status -o json/yaml, status --schedule given a plan file."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples import FACTS, PLAN

ESCAPE = b"\x1b["


def run_on_terminal(*words: str) -> tuple[int, bytes]:
    """Run `rollout WORDS` with its output on a pseudo-terminal; its exit code and output."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rollout", *words],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"},
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the child has exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return process.wait(timeout=120), b"".join(chunks)


@pytest.mark.parametrize(
    ("words", "exit_code"),
    [
        (("plan", str(PLAN), "--facts", str(FACTS)), 0),
        # the example fleet has a broken node: diagnose exits 1
        (("diagnose", "--facts", str(FACTS)), 1),
    ],
    ids=["plan", "diagnose"],
)
def test_color_never_on_a_terminal_writes_no_escape(
    words: tuple[str, ...], exit_code: int
) -> None:
    _, coloured = run_on_terminal(*words, "--color", "auto")
    assert ESCAPE in coloured  # a terminal indeed: auto colours it
    code, plain = run_on_terminal(*words, "--color", "never")
    assert code == exit_code
    assert ESCAPE not in plain
    assert b"gpu-a-3" in plain
