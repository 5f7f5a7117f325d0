"""Fixtures the unit tests share: a run to journal into."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.run import Journal
from tests.unit.runfakes import open_journal


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    """A fresh run in the test's directory, open for appending, closed after the test."""
    yield from open_journal(tmp_path)
