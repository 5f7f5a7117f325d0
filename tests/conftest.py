"""Shared fixtures: real containerd binaries and the lab.

Tests that need real parts never skip in CI (CI=true): they fail loudly with what is
missing. Outside CI they skip with the command that provides the part.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollout.containerd.binaries import BinariesMissing, find_containerd

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
SERIES = ("1.6", "1.7", "2.1")


def require(reason: str) -> None:
    """Fail in CI, skip elsewhere: a test that needs a part it cannot have."""
    if IN_CI:
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session", params=SERIES)
def containerd_bin(request: pytest.FixtureRequest) -> Path:
    """The real containerd binary of one series (1.6, 1.7, 2.1), parametrised over all three."""
    return containerd_binary(str(request.param))


def containerd_binary(series: str) -> Path:
    try:
        return find_containerd(series)
    except BinariesMissing as exc:
        require(str(exc))
        raise  # unreachable: require() always raises


# In CI a skipped test is a failed run: every part a test needs is installed by the README's
# test command, so a skip there means something was not tested. require() already fails in
# CI; this catches a skip from anywhere else (a marker, a plugin, a helper's pytest.skip).
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"skipped tests: {len(_skipped)}")
    if IN_CI and _skipped:
        terminalreporter.write_line(
            "CI=true: a skipped test fails the run: " + ", ".join(_skipped[:20]), red=True
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if IN_CI and _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
