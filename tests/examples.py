"""Where the repository's example plan and facts lie, for the suites that read them."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "examples" / "plan.yaml"
FACTS = REPO / "examples" / "facts"


def edited_plan(directory: Path, old: str, new: str) -> Path:
    """A copy of the example plan in `directory`, with `old` (which must be there) made `new`."""
    text = PLAN.read_text()
    assert old in text, f"the example plan no longer holds {old!r}"
    path = directory / "plan.yaml"
    path.write_text(text.replace(old, new))
    return path
