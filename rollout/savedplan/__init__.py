"""Saved plans: `rollout plan --out FILE` writes one, `rollout show FILE` renders it,
`rollout apply FILE` runs exactly it, each node refused whose facts moved since."""

from rollout.savedplan.document import (
    JOURNAL_KEY,
    SavedPlan,
    SavedPlanRefused,
    is_saved_plan,
    make_saved_plan,
    read_saved_plan,
    saved_plan_data,
    saved_plan_from_text,
    saved_plan_to_text,
    spec_text_of,
    write_saved_plan,
)

__all__ = [
    "JOURNAL_KEY",
    "SavedPlan",
    "SavedPlanRefused",
    "is_saved_plan",
    "make_saved_plan",
    "read_saved_plan",
    "saved_plan_data",
    "saved_plan_from_text",
    "saved_plan_to_text",
    "spec_text_of",
    "write_saved_plan",
]
