"""A saved plan's file: what `rollout plan --out` wrote, checked whole before anything reads it.

The file is a header line (how `rollout apply` and `rollout show` tell a saved plan from a
plan.yaml, whatever its name) and one JSON document: the format, the tool version, the spec
text, the plan as shown (credentials `<redacted>`), per node the digests of the facts its
plan was made from and of its real file texts, the cluster's digests, and a checksum over
all of it. An edited, truncated or other-version file is refused (exit 2), saying which.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout import __version__
from rollout.errors import BadInput
from rollout.facts import FleetFacts
from rollout.inputs.inputfile import read_text
from rollout.plan import Plan, plan_from_data, plan_to_data, redact_plan
from rollout.savedplan.credentials import file_digests, strip_file
from rollout.savedplan.digests import cluster_digests, digest_text, node_digests

HEADER = (
    "# rollout saved plan, format 1 (`rollout show FILE` reads it, `rollout apply FILE` runs it)"
)
HEADER_PREFIX = "# rollout saved plan"
FORMAT = 1
# A saved plan of a large fleet holds every node's texts: more than a plan.yaml's limit.
MAX_SAVED_BYTES = 512 * 1024 * 1024
# the key a run's journalled plan keeps the saved plan's digests under (plan_from_data
# ignores keys it does not know)
JOURNAL_KEY = "saved_plan"


class SavedPlanRefused(BadInput):
    """A saved plan that cannot be trusted as written: edited, truncated, another version."""


@dataclass(frozen=True)
class SavedPlan:
    """A saved plan as read back: the plan (credentials redacted) and what it was made from."""

    spec_source: str
    spec_text: str
    plan: Plan
    # node -> fact name -> digest
    facts: Mapping[str, Mapping[str, str]]
    cluster: Mapping[str, str]
    # node -> path -> {"before": digest, "after": digest} of the real texts
    files: Mapping[str, Mapping[str, Mapping[str, str | None]]]
    tool_version: str = __version__
    checksum: str = ""
    forecast: Mapping[str, Any] = field(default_factory=dict)

    def digests_to_data(self) -> dict[str, Any]:
        """What a run needs of the saved plan besides the plan (journalled with it)."""
        return {
            "checksum": self.checksum,
            "facts": self.facts,
            "cluster": self.cluster,
            "files": self.files,
        }


def make_saved_plan(
    plan: Plan, fleet: FleetFacts, spec_source: str, spec_text: str, forecast: Mapping[str, Any]
) -> SavedPlan:
    """The saved form of a plan just made from `fleet`."""
    shown = redact_plan(plan)
    stripped = {
        node.name: tuple(strip_file(change) for change in node.files) for node in plan.nodes
    }
    waves = tuple(
        dataclasses.replace(
            wave,
            nodes=tuple(
                dataclasses.replace(node, files=stripped[node.name]) for node in wave.nodes
            ),
        )
        for wave in shown.waves
    )
    facts = {node.name: node_digests(node) for node in fleet.nodes if node.name in stripped}
    return SavedPlan(
        spec_source=spec_source,
        spec_text=spec_text,
        plan=dataclasses.replace(shown, waves=waves),
        facts=facts,
        cluster=cluster_digests(fleet.cluster),
        files={node.name: file_digests(node) for node in plan.nodes},
        forecast=forecast,
    )


def saved_plan_data(saved: SavedPlan | None) -> dict[str, Any]:
    """What a run journals beside its plan when it runs a saved plan ({} otherwise)."""
    return {} if saved is None else {JOURNAL_KEY: saved.digests_to_data()}


def _body(saved: SavedPlan) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "tool_version": saved.tool_version,
        "spec": {"source": saved.spec_source, "text": saved.spec_text},
        "plan": plan_to_data(saved.plan),
        "forecast": dict(saved.forecast),
        "facts": saved.facts,
        "cluster": saved.cluster,
        "files": saved.files,
    }


def _checksum(body: Mapping[str, Any]) -> str:
    return digest_text(HEADER + "\n" + json.dumps(body, sort_keys=True, separators=(",", ":")))


def saved_plan_to_text(saved: SavedPlan) -> str:
    """The file `rollout plan --out` writes."""
    body = _body(saved)
    document = {**body, "checksum": _checksum(body)}
    return HEADER + "\n" + json.dumps(document, indent=1) + "\n"


def write_saved_plan(path: Path, saved: SavedPlan) -> None:
    """Write the saved plan, readable by its owner only (it names nodes and files)."""
    text = saved_plan_to_text(saved)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def is_saved_plan_text(text: str) -> bool:
    """Whether a file's text is a saved plan (by its header, whatever the file's name)."""
    return text.startswith(HEADER_PREFIX)


def is_saved_plan(path: Path) -> bool:
    """Whether the file at `path` starts as a saved plan does; False when unreadable or not a
    regular file (a FIFO or a device is left to the plan reader, which refuses it: opening one
    here would block)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        with path.open("rb") as handle:
            return handle.read(len(HEADER_PREFIX)).decode("utf-8", "replace") == HEADER_PREFIX
    except OSError:
        return False


def read_saved_plan(path: Path) -> SavedPlan:
    """Read and check a saved plan; SavedPlanRefused (exit 2) says what is wrong."""
    return saved_plan_from_text(read_text(path, max_bytes=MAX_SAVED_BYTES), str(path))


def saved_plan_from_text(text: str, source: str) -> SavedPlan:
    """A saved plan's text, checked: header, JSON, version, checksum."""
    again = "plan again with `rollout plan PLAN --out FILE`"
    header, _, rest = text.partition("\n")
    if not header.startswith(HEADER_PREFIX):
        raise SavedPlanRefused(f"{source}: not a saved plan (no `{HEADER_PREFIX}` header)")
    try:
        document = json.loads(rest)
    except json.JSONDecodeError as exc:
        raise SavedPlanRefused(
            f"{source}: the saved plan is truncated or damaged ({exc.msg} at line "
            f"{exc.lineno + 1}); {again}"
        ) from None
    if not isinstance(document, dict):
        raise SavedPlanRefused(f"{source}: the saved plan is damaged (not an object); {again}")
    version = document.get("tool_version")
    if header != HEADER or document.get("format") != FORMAT or version != __version__:
        raise SavedPlanRefused(
            f"{source}: saved by rollout {version} (format {document.get('format')}); this is "
            f"rollout {__version__} (format {FORMAT}), which runs only the plans it saved; "
            f"{again}"
        )
    checksum = document.pop("checksum", None)
    if checksum != _checksum(document):
        raise SavedPlanRefused(
            f"{source}: the saved plan was edited since it was saved (its checksum "
            f"{checksum} does not match its content, {_checksum(document)}); {again}"
        )
    try:
        return SavedPlan(
            spec_source=str(document["spec"]["source"]),
            spec_text=str(document["spec"]["text"]),
            plan=plan_from_data(document["plan"]),
            facts=document["facts"],
            cluster=document["cluster"],
            files=document["files"],
            tool_version=str(version),
            checksum=str(checksum),
            forecast=document.get("forecast") or {},
        )
    except (KeyError, TypeError) as exc:
        raise SavedPlanRefused(f"{source}: the saved plan lacks {exc}; {again}") from None


def spec_text_of(text: str, source: str) -> tuple[str, str]:
    """The plan.yaml text and its source of a file that may be a saved plan (checked)."""
    if not is_saved_plan_text(text):
        return text, source
    saved = saved_plan_from_text(text, source)
    return saved.spec_text, saved.spec_source
