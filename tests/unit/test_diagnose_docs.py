"""docs/diagnose.md's table of checks against rollout/diagnose: every check the code can report
is documented, and the table names no check the code lacks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "rollout" / "diagnose"
DOC = ROOT / "docs" / "diagnose.md"
# a check id as the code writes it: "<branch>.<words>"
CHECK_ID = re.compile(r'"((?:runtime|node|advertising|operator|pods)\.[a-z]+(?:-[a-z0-9]+)*)"')


def coded_checks() -> set[str]:
    return {m for p in SOURCES.rglob("*.py") for m in CHECK_ID.findall(p.read_text())}


def documented_checks() -> set[str]:
    rows = re.findall(r"^\| `([a-z]+\.[a-z0-9-]+)` \|", DOC.read_text(), re.MULTILINE)
    return set(rows)


def test_every_check_is_documented_and_no_other() -> None:
    coded, documented = coded_checks(), documented_checks()
    assert {"operator.validator-not-ready", "advertising.row-remap-pending"} <= coded
    assert coded - documented == set(), "docs/diagnose.md lacks these checks"
    assert documented - coded == set(), "docs/diagnose.md documents checks the code lacks"
