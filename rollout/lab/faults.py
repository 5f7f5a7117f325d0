"""Faults the lab injects on purpose: which, how often, reproducibly, and the log of each one.

A lab's faults live in two files of its directory, so `rollout lab faults` changes them on a
running lab and a test reads back what happened:

- ``faults.json``: the settings (`FaultSettings`), read again by the API server whenever
  the file changes;
- ``faults.log``: one JSON line per injected fault (time, id, where, the request, the kind),
  so a test can tie each retry of rollout's to the fault that caused it.

Whether a request is faulted is a pure function of the seed, the request (method, path and
query, or the SSH session's node and command with its random parts replaced:
rollout.lab.sshfaults.decision_key) and how many times that same request was seen before: the
same seed gives the same faults to the same sequence of requests, whatever other requests
interleave (`decide`).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollout.errors import BadInput

FAULTS_FILE = "faults.json"
FAULT_LOG = "faults.log"
# Longer than rollout's default read timeout (30 s): a slow reply is one the client gave up on.
DEFAULT_SLOW_S = 35.0
DEFAULT_RETRY_AFTER_S = 1
DEFAULT_LINK_S = 2.0
# 32 KB/s: a `containerd config dump` (10-20 KB) takes about half a second to come back.
DEFAULT_LINK_KBIT = 256


class ApiFault(enum.Enum):
    """What the API server does instead of (or after) serving a request."""

    SERVER_ERROR = "500"  # InternalError, nothing done
    UNAVAILABLE = "503"  # ServiceUnavailable, nothing done
    THROTTLED = "429"  # TooManyRequests with Retry-After, nothing done
    RESET = "reset"  # the connection closed with no answer, nothing done
    SLOW = "slow"  # the request is served, the answer comes after the client's timeout
    CONFLICT = "409"  # updates only: another writer won, nothing done
    WATCH_CUT = "watch-cut"  # watches only: the stream ends after its first events

    @property
    def acts(self) -> bool:
        """Whether the server carried the request out before failing it."""
        return self is ApiFault.SLOW


class SshFault(enum.Enum):
    """What the lab does to an SSH session or a node."""

    CUT = "cut"  # the session's sshd process killed mid-command
    REFUSED = "refused"  # sshd stopped for a while, then started again
    SLOW = "slow-link"  # the node's link throttled for a while
    KILLED = "node-killed"  # the node's nspawn killed: the node is dead
    BOOTED = "node-booted"  # a killed node booted again


# The kinds a request can get, by what the request is.
READ_KINDS = (
    ApiFault.SERVER_ERROR,
    ApiFault.UNAVAILABLE,
    ApiFault.THROTTLED,
    ApiFault.RESET,
    ApiFault.SLOW,
)
WRITE_KINDS = (*READ_KINDS, ApiFault.CONFLICT)
WATCH_KINDS = (*READ_KINDS, ApiFault.WATCH_CUT)
SSH_KINDS = (SshFault.CUT, SshFault.REFUSED, SshFault.SLOW)  # what `ssh=RATE` injects
UPDATE_METHODS = frozenset({"PUT", "PATCH"})


# The random parts rollout puts in the commands and API requests it sends, each with the
# placeholder that stands for it in a decision key, in the order they are replaced:
RANDOM_PARTS = (
    # a run id (rollout.run.files.make_run_id: UTC stamp, plan slug, 4 random hex digits):
    # backup paths, staging owners
    (re.compile(r"\b\d{8}-\d{6}-((?:[a-z0-9]+-)*)[0-9a-f]{4}\b"), r"<run>-\1<hex>"),
    # the fact batch's frame (rollout.facts.batch: rollout-fact- and 24 random hex digits)
    (re.compile(r"\brollout-fact-[0-9a-f]+"), "rollout-fact-<boundary>"),
    # a smoke pod's name (rollout.steps.gpu_smoke: rollout-smoke-NODE- and 6 hex of the run id)
    (re.compile(r"(\brollout-smoke-[^\s/?&]*-)[0-9a-f]{6}\b"), r"\1<hex>"),
    # the version a watch starts from (the list's, which depends on what else was written)
    (re.compile(r"([?&]resourceVersion=)[0-9]+"), r"\1<rv>"),
    # what `mktemp` made of a template's ten Xs: a staging directory
    # (rollout.containerd.staging, rollout-containerd.[OWNER.]XXXXXXXXXX) or a file's temporary
    # copy beside it (rollout.steps.backup, .rollout.XXXXXXXXXX)
    (
        re.compile(r"(\brollout-containerd\.(?:[^\s./]+\.)?|/\.rollout\.)[A-Za-z0-9]{10}\b"),
        r"\1<mktemp>",
    ),
)


# A rate that faults each distinct request the first time it is seen, and never again.
ONCE = "once"


@dataclass(frozen=True)
class FaultSettings:
    """How often each kind of request is faulted, and with which kinds of fault.

    A rate is a probability in [0, 1] per request, or "once": every distinct request
    (method and path) fails the first time it is made and never again.
    """

    seed: int = 0
    api_read: float | str = 0.0
    api_write: float | str = 0.0
    ssh: float = 0.0
    kinds: tuple[str, ...] = ()  # API fault kinds allowed; () means all
    ssh_kinds: tuple[str, ...] = ()  # SSH fault kinds allowed; () means all
    slow_s: float = DEFAULT_SLOW_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    refused_s: float = 3.0  # how long sshd stays stopped for a REFUSED fault
    link_s: float = DEFAULT_LINK_S  # how long a node's link stays slow
    link_kbit: int = DEFAULT_LINK_KBIT  # how fast a slow link is, kbit/s each way

    @property
    def active(self) -> bool:
        return bool(self.api_read or self.api_write or self.ssh)

    def to_json(self) -> dict[str, Any]:
        """Every field by its name (json writes the kinds' tuples as lists)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultSettings:
        return cls(
            seed=int(data.get("seed", 0)),
            api_read=_rate(str(data.get("api_read", 0)), "api_read"),
            api_write=_rate(str(data.get("api_write", 0)), "api_write"),
            ssh=float(_rate(str(data.get("ssh", 0)), "ssh", once_ok=False)),
            kinds=tuple(data.get("kinds") or ()),
            ssh_kinds=tuple(data.get("ssh_kinds") or ()),
            slow_s=float(data.get("slow_s", DEFAULT_SLOW_S)),
            retry_after_s=int(data.get("retry_after_s", DEFAULT_RETRY_AFTER_S)),
            refused_s=float(data.get("refused_s", 3.0)),
            link_s=float(data.get("link_s", DEFAULT_LINK_S)),
            link_kbit=int(data.get("link_kbit", DEFAULT_LINK_KBIT)),
        )

    def describe(self) -> str:
        if not self.active:
            return "no faults"
        parts = []
        if self.api_read == self.api_write:
            parts.append(f"api={self.api_read}")
        else:
            parts += [f"api-read={self.api_read}", f"api-write={self.api_write}"]
        parts.append(f"ssh={self.ssh}")
        if self.kinds:
            parts.append("kinds=" + "+".join(self.kinds))
        if self.ssh_kinds:
            parts.append("ssh-kinds=" + "+".join(self.ssh_kinds))
        parts.append(f"slow={self.slow_s:g}")
        return ",".join(parts) + f" (seed {self.seed})"


SPEC_HELP = (
    "comma list of KEY=VALUE: api=RATE (reads and writes), api-read=RATE, api-write=RATE "
    "(RATE: a probability 0..1 per request, or `once`: each distinct request fails the "
    "first time only), ssh=RATE (per SSH session), kinds=K+K (API kinds: "
    + "+".join(k.value for k in ApiFault)
    + "), ssh-kinds=K+K ("
    + "+".join(k.value for k in SSH_KINDS)
    + "), slow=SECONDS (how late a slow answer comes), retry-after=SECONDS, "
    "refused=SECONDS (how long sshd stays down), link=SECONDS (how long a node's link "
    f"stays slow, {DEFAULT_LINK_S:g}), link-rate=KBIT (a slow link's speed in kbit/s, "
    f"{DEFAULT_LINK_KBIT}); `off` turns every fault off"
)


def parse_fault_spec(text: str, seed: int = 0) -> FaultSettings:
    """`api=0.2,ssh=0.1` -> FaultSettings; BadInput says which item is wrong and why."""
    settings = FaultSettings(seed=seed)
    if text.strip() in ("off", "none", ""):
        return settings
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise BadInput(f"--faults: {item!r} is not KEY=VALUE; {SPEC_HELP}")
        where = f"--faults {key}"
        if key == "api":
            rate = _rate(value, where)
            settings = replace(settings, api_read=rate, api_write=rate)
        elif key == "api-read":
            settings = replace(settings, api_read=_rate(value, where))
        elif key == "api-write":
            settings = replace(settings, api_write=_rate(value, where))
        elif key == "ssh":
            settings = replace(settings, ssh=float(_rate(value, where, once_ok=False)))
        elif key == "kinds":
            settings = replace(settings, kinds=_kinds(value, ApiFault, where))
        elif key == "ssh-kinds":
            settings = replace(settings, ssh_kinds=_kinds(value, SSH_KINDS, where))
        elif key in ("slow", "retry-after", "refused", "link", "link-rate"):
            number = _number(value, where, "kbit/s" if key == "link-rate" else "seconds")
            if key == "slow":
                settings = replace(settings, slow_s=number)
            elif key == "retry-after":
                settings = replace(settings, retry_after_s=max(1, round(number)))
            elif key == "refused":
                settings = replace(settings, refused_s=number)
            elif key == "link":
                settings = replace(settings, link_s=number)
            else:
                settings = replace(settings, link_kbit=max(8, round(number)))
        else:
            raise BadInput(f"--faults: unknown key {key!r}; {SPEC_HELP}")
    return settings


def _rate(value: str, where: str, *, once_ok: bool = True) -> float | str:
    if value == ONCE and once_ok:
        return ONCE
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        allowed = "a probability between 0 and 1" + (" or `once`" if once_ok else "")
        raise BadInput(f"{where}: {value!r} is not {allowed}")
    return rate


def _number(value: str, where: str, unit: str = "seconds") -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0:
        raise BadInput(f"{where}: {value!r} is not a number of {unit} (0 or more)")
    return number


def _kinds(value: str, kinds: Iterable[enum.Enum], where: str) -> tuple[str, ...]:
    known = {str(k.value) for k in kinds}
    chosen = tuple(v.strip() for v in value.split("+") if v.strip())
    unknown = [v for v in chosen if v not in known]
    if not chosen or unknown:
        raise BadInput(
            f"{where}: unknown kind(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(sorted(known))} (join several with +)"
        )
    return chosen


# ------------------------------------------------------------------------------ decisions


def decide(
    seed: int, rate: float | str, request: str, occurrence: int, kinds: Sequence[enum.Enum]
) -> enum.Enum | None:
    """The fault for the `occurrence`-th (from 0) sight of `request`, or None; pure."""
    if not kinds or not rate:
        return None
    digest = hashlib.sha256(f"{seed}|{request}|{occurrence}".encode()).digest()
    if rate == ONCE:
        hit = occurrence == 0
    else:
        hit = int.from_bytes(digest[:8], "big") / 2**64 < float(rate)
    if not hit:
        return None
    return kinds[int.from_bytes(digest[8:12], "big") % len(kinds)]


def without_random_parts(request: str) -> str:
    """`request` (an SSH command, an API path and query) with each of RANDOM_PARTS replaced by
    its placeholder: the key `decide` is given, the same for a request however a run's random
    choices came out."""
    for pattern, placeholder in RANDOM_PARTS:
        request = pattern.sub(placeholder, request)
    return request


def allowed(kinds: Iterable[enum.Enum], chosen: Sequence[str]) -> tuple[enum.Enum, ...]:
    """The kinds of `kinds` that the settings allow (all when `chosen` is empty)."""
    return tuple(k for k in kinds if not chosen or str(k.value) in chosen)


@dataclass
class FaultLog:
    """faults.log of a lab: append-only, one JSON object per injected fault."""

    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _count: int = 0

    def record(self, where: str, request: str, fault: enum.Enum, **extra: Any) -> int:
        """Append one fault; returns its id (1, 2, ...) in this log."""
        with self._lock:
            if self._count == 0 and self.path.exists():
                self._count = sum(1 for _ in self.path.open("rb"))
            self._count += 1
            entry = {
                "id": self._count,
                "at": datetime.now(UTC).isoformat(),
                "where": where,
                "request": request,
                "fault": str(fault.value),
                **extra,
            }
            with self.path.open("a") as out:
                out.write(json.dumps(entry) + "\n")
            return self._count


@dataclass(frozen=True)
class InjectedFault:
    """One line of faults.log."""

    id: int
    at: datetime
    where: str  # "api" or a node name
    request: str  # "PATCH /api/v1/nodes/lab-node-1" or the SSH command
    fault: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InjectedFault:
        return cls(
            int(data["id"]),
            datetime.fromisoformat(str(data["at"])),
            str(data["where"]),
            str(data["request"]),
            str(data["fault"]),
        )


def read_fault_log(lab_dir: Path) -> list[InjectedFault]:
    """Every fault the lab in lab_dir injected so far, oldest first."""
    path = lab_dir / FAULT_LOG
    if not path.exists():
        return []
    return [InjectedFault.from_json(json.loads(line)) for line in path.open() if line.strip()]


def read_settings(lab_dir: Path) -> FaultSettings:
    """The lab's fault settings (none when it has no faults.json)."""
    path = lab_dir / FAULTS_FILE
    if not path.exists():
        return FaultSettings()
    return FaultSettings.from_json(json.loads(path.read_text()))


def write_settings(lab_dir: Path, settings: FaultSettings) -> None:
    """Replace the lab's fault settings; a running lab picks them up on its next request."""
    path = lab_dir / FAULTS_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    temporary.replace(path)
