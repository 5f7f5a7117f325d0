"""rich is imported where text is drawn: `plan -o json` draws none and never imports it."""

from __future__ import annotations

from tests.examples import FACTS, PLAN
from tests.unit.test_startup import imported_after


def test_plan_as_json_imports_no_rich() -> None:
    imported = imported_after(["plan", str(PLAN), "--facts", str(FACTS), "-o", "json"])
    assert "rich" not in imported
    assert "pydantic" in imported  # it did plan: the check is not vacuous


def test_plan_as_text_draws_with_rich() -> None:
    assert "rich" in imported_after(["plan", str(PLAN), "--facts", str(FACTS)])
