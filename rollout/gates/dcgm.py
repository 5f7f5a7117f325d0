"""The DCGM gate's reading: `dcgmi diag -r LEVEL -j` output, test by test and GPU by GPU.

Two shapes of the JSON are read (NVIDIA/DCGM dcgmi/Diag.cpp):
- DCGM 4: `{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass", "warnings":
  [{"warning", "error_id", ...}]}], "test_summary": {"status"}}]}]}, "metadata": {...}}`;
- DCGM 3 and older: the same tree with `"gpu_id"` ("gpu_ids" in NVVS's own output, a list
  "0,1") per result, and the Deployment tests' one result standing for every GPU.
Statuses are compared without case (`Pass`, `PASS`, `pass`). Anything printed before the
document (a "Successfully ran diagnostic" line, a warning) is skipped. A run that could not
happen says so in `runtime_error`, which fails the gate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

DCGM_SCRIPT_WORDS = ("dcgmi", "diag", "-r")
_DOCUMENT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
WARNING_CHARS = 200


class DcgmStatus(Enum):
    """A test's result for one GPU (or for all, where DCGM gives one result)."""

    PASS = "Pass"
    FAIL = "Fail"
    WARN = "Warn"
    SKIP = "Skip"

    @classmethod
    def from_text(cls, text: object) -> DcgmStatus:
        word = str(text).strip().lower()
        for status in cls:
            if word.startswith(status.value.lower()):  # "Skip - All", "SKIPPED"
                return status
        return cls.FAIL  # a status the gate cannot read does not pass a node


@dataclass(frozen=True)
class DcgmResult:
    """One test's result: its GPU (None: every GPU tested), its status and what it said."""

    test: str
    gpu: int | None
    status: DcgmStatus
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        said = f" ({'; '.join(self.warnings)})" if self.warnings else ""
        return f"{self.test}: {self.status.value}{where}{said}"


class DcgmReadingError(ValueError):
    """The output holds no diagnostic document, or the run reported an error."""


@dataclass(frozen=True)
class DcgmReading:
    """Every test's results, in the order dcgmi printed them."""

    results: tuple[DcgmResult, ...]

    @property
    def failed(self) -> tuple[DcgmResult, ...]:
        return tuple(r for r in self.results if r.status is DcgmStatus.FAIL)

    def summary(self) -> str:
        """One entry per test: its status on each GPU, for the journal."""
        tests: dict[str, list[DcgmResult]] = {}
        for result in self.results:
            tests.setdefault(result.test, []).append(result)
        parts = []
        for test, results in tests.items():
            statuses = {r.status for r in results}
            if len(statuses) == 1:
                gpus = [str(r.gpu) for r in results if r.gpu is not None]
                on = f" (GPU {', '.join(gpus)})" if gpus else ""
                parts.append(f"{test} {results[0].status.value}{on}")
            else:
                each = ", ".join(f"GPU {r.gpu} {r.status.value}" for r in results)
                parts.append(f"{test} {each}")
        return "; ".join(parts)


def describe_mig_skip(strategy: str) -> str:
    """The gate's named skip on a node whose GPUs are in MIG mode (under `strategy`).

    DCGM's diagnostic is not run where MIG is enabled on any GPU of the node: AWS
    ParallelCluster's GPU health check skips `dcgmi diag` so ("not supported when MIG is
    enabled on any GPU on the node", verified up to DCGM 4.5.3), and the gate's pod, holding
    every nvidia.com/gpu, would get MIG devices (single) or none at all (mixed). Said by name,
    in the plan and the run, rather than a silent pass or a failure about the pod.
    """
    return (
        f"dcgm skipped: the node's GPUs are in MIG mode ({strategy} strategy), where "
        "dcgmi diag does not run"
    )


def dcgm_command(level: int) -> list[str]:
    """The diagnostic's command line, as the pod runs it."""
    return [*DCGM_SCRIPT_WORDS, str(level), "-j"]


def parse_dcgm_output(text: str) -> DcgmReading:
    """`dcgmi diag -j` output -> every test's result per GPU."""
    document = _find_document(text)
    if isinstance(document.get("runtime_error"), str):
        raise DcgmReadingError(f"dcgmi could not run the diagnostic: {document['runtime_error']}")
    results: list[DcgmResult] = []
    for category in _list(document.get("test_categories")):
        for test in _list(_dict(category).get("tests")):
            entry = _dict(test)
            name = str(entry.get("name") or "(unnamed test)")
            per_gpu = [_read_result(name, _dict(r)) for r in _list(entry.get("results"))]
            results += [r for r in per_gpu if r is not None]
            summary = _dict(entry.get("test_summary"))
            if not per_gpu and "status" in summary:
                results.append(_result(name, None, summary))
    if not results:
        raise DcgmReadingError("the diagnostic's output lists no test result")
    return DcgmReading(tuple(results))


def _find_document(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        raise DcgmReadingError("no JSON document in the output")
    try:
        root, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as exc:
        raise DcgmReadingError(f"unreadable JSON: {exc}") from exc
    for key in _DOCUMENT_KEYS:
        if isinstance(_dict(root).get(key), dict):
            return dict(root[key])
    raise DcgmReadingError(f"no {' or '.join(map(repr, _DOCUMENT_KEYS))} in the JSON document")


def _read_result(test: str, entry: dict[str, Any]) -> DcgmResult | None:
    group = entry.get("entity_group")
    if group is not None and str(group).upper() != "GPU":
        return None  # a CPU's or a switch's result: the gate is about the node's GPUs
    gpu = entry.get("entity_id", entry.get("gpu_id", entry.get("gpu_ids")))
    return _result(test, _gpu_index(gpu), entry)


def _result(test: str, gpu: int | None, entry: dict[str, Any]) -> DcgmResult:
    warnings = []
    for warning in _list(entry.get("warnings")):
        said = _dict(warning).get("warning", _dict(warning).get("warnings", warning))
        warnings.append(str(said)[:WARNING_CHARS])
    return DcgmResult(test, gpu, DcgmStatus.from_text(entry.get("status")), tuple(warnings))


def _gpu_index(value: object) -> int | None:
    """A GPU id (0, "0"); None for a list ("0,1,2": the result of every GPU) or nothing."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    # older dcgmi versions leave nulls in the arrays where a test was not run
    return [v for v in value if v is not None] if isinstance(value, list) else []
