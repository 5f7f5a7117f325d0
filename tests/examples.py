"""Where the repository's example plan and facts lie, for the suites that read them."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "examples" / "plan.yaml"
FACTS = REPO / "examples" / "facts"
