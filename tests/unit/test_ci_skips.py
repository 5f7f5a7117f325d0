"""CI cannot skip: with CI=true a run in which any test was skipped fails, and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.examples import REPO

PROBE = """
import pytest

def test_skipped():
    pytest.skip("a part this machine lacks")

def test_passes():
    pass
"""


def run_probe(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


def test_a_skip_fails_a_ci_run_and_is_counted(tmp_path: Path) -> None:
    done = run_probe(tmp_path, "true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped tests: 1" in done.stdout
    assert "a skipped test fails the run: test_probe.py::test_skipped" in done.stdout


def test_outside_ci_a_skip_is_only_counted(tmp_path: Path) -> None:
    done = run_probe(tmp_path, "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped tests: 1" in done.stdout


def test_ci_run_sets_ci_whatever_it_inherits() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "export CI=true\n" in script
    assert "${CI:-" not in script
