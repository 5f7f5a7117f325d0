"""Plan files as data: every valid file loads; every invalid file fails with its expectations.

An invalid file lists what it expects in trailing comments:
`# expect: LINE:COL field.path: message` must appear as `<file>:LINE:COL: field.path: message`
in the error text, and the file must produce exactly as many errors as it has such lines;
`# expect: fragment` (no location) must appear somewhere, e.g. a hint.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollout.errors import ExitCode, InputErrors
from rollout.spec import load_spec

DATA = Path(__file__).parent / "data" / "spec"
VALID = sorted((DATA / "valid").glob("*.yaml"))
INVALID = sorted((DATA / "invalid").glob("*.yaml"))
LOCATED = re.compile(r"^(\d+):(\d+) (.*)$")


def expectations(path: Path) -> list[str]:
    return [
        line.removeprefix("# expect: ")
        for line in path.read_text().splitlines()
        if line.startswith("# expect: ")
    ]


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_plan_loads(path: Path) -> None:
    spec = load_spec(path)
    assert spec.changes
    assert spec.source == str(path)


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_plan_reports_every_problem(path: Path) -> None:
    wanted = expectations(path)
    assert wanted, f"{path.name} has no '# expect:' lines"
    with pytest.raises(InputErrors) as caught:
        load_spec(path)
    text = str(caught.value)
    located = 0
    for item in wanted:
        match = LOCATED.match(item)
        if match:
            located += 1
            line, column, rest = match.groups()
            assert f"{path}:{line}:{column}: {rest}" in text, text
        else:
            assert item in text, text
    assert len(caught.value.errors) == located, text
    assert caught.value.exit_code == ExitCode.BAD_INPUT


def test_there_are_enough_cases() -> None:
    assert len(VALID) >= 3
    assert len(INVALID) >= 40
