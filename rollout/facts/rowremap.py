"""The row-remap fact: each GPU's pending and failed row remaps, as `nvidia-smi
--query-remapped-rows` reports them (Ampere and newer).

A pending remap takes effect only at the next GPU reset (NVML: "a reset will be required to
actually remap the row"); a failure means a remap once failed: the GPU is out of spare rows.
Drivers print the flags as 0/1 or No/Yes; a GPU without row remapping (older GPUs, MIG with
instances) prints N/A, which is neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.fact import CommandFact

BUS_FIELD, PENDING_FIELD, FAILURE_FIELD = (
    "gpu_bus_id",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
REMAP_FIELDS = (BUS_FIELD, PENDING_FIELD, FAILURE_FIELD)
REMAP_HEADER = ", ".join(REMAP_FIELDS)
_YES = frozenset({"yes", "true", "1"})
_NO = frozenset({"no", "false", "0"})


@dataclass(frozen=True)
class RemappedRows:
    """One GPU's row-remap state; a flag is None where the GPU does not report it."""

    bus_id: str
    pending: bool | None
    failure: bool | None
    # the line as nvidia-smi printed it, for evidence and recording
    line: str


def parse_flag(text: str) -> bool | None:
    """`1`, `Yes` -> True; `0`, `No` -> False; `N/A`, `[Not Supported]`, ... -> None."""
    word = text.strip().lower()
    if word in _YES:
        return True
    if word in _NO:
        return False
    return True if word.isdigit() and int(word) > 0 else None


def parse_remapped_rows(text: str) -> tuple[RemappedRows, ...]:
    """`nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure
    --format=csv` -> one RemappedRows per GPU line (its bus id holds a `:`); columns found by
    the header where there is one, else in the queried order."""
    columns = list(REMAP_FIELDS)
    rows: list[RemappedRows] = []
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.split(",")]
        if BUS_FIELD in (names := [c.split(" ")[0] for c in cells]):
            columns = names  # the header, a unit (`[...]`) after a name dropped
            continue
        if len(cells) != len(columns) or ":" not in cells[0]:
            continue  # an error line ("No devices were found"), not a GPU's
        value = dict(zip(columns, cells, strict=True))
        rows.append(
            RemappedRows(
                bus_id=value.get(BUS_FIELD, ""),
                pending=parse_flag(value.get(PENDING_FIELD, "")),
                failure=parse_flag(value.get(FAILURE_FIELD, "")),
                line=raw.strip(),
            )
        )
    return tuple(rows)


def remapped_rows_text(rows: tuple[RemappedRows, ...]) -> str:
    """The csv text parse_remapped_rows reads back as `rows` (what `facts record` writes)."""
    return "".join(f"{line}\n" for line in (REMAP_HEADER, *(r.line for r in rows)))


class RemappedRowsFact(CommandFact[tuple[RemappedRows, ...]]):
    """`nvidia-smi --query-remapped-rows` -> each GPU's RemappedRows.

    Optional: a node without nvidia-smi, a driver or row remapping has no remaps to report.
    """

    optional = True
    sentence = "query the GPUs' remapped rows"
    argv = ("nvidia-smi", f"--query-remapped-rows={','.join(REMAP_FIELDS)}", "--format=csv")
    parser = staticmethod(parse_remapped_rows)
