"""The containerd.service fact: one `systemctl show` property list, one parser, one type.

Read by live probing (the plan shows the service's state), by preflight (containerd must run
before any change) and by systemd.restart and containerd.verify (the restart proof).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from rollout.fact import CommandFact, ProbeFailed
from rollout.inputs.wholenumber import whole_number

SERVICE = "containerd"
SHOW_PROPERTIES = (
    "MainPID",
    "ActiveState",
    "SubState",
    "NRestarts",
    "ActiveEnterTimestamp",
    "InvocationID",
)
# `--timestamp=us+utc` (systemd >= 248) prints microseconds in UTC, so a restart in the same
# second as the write is still ordered after it, whatever the node's time zone.
_TIMESTAMP_FORMATS = ("%a %Y-%m-%d %H:%M:%S.%f UTC", "%a %Y-%m-%d %H:%M:%S UTC")


class ServiceProbeFailed(ProbeFailed):
    """`systemctl show` did not say what rollout needs to know about the service."""


@dataclass(frozen=True)
class ServiceState:
    """What `systemctl show` says about one service at one moment."""

    main_pid: int
    active_state: str
    sub_state: str
    n_restarts: int | None
    active_enter_at: datetime | None
    invocation_id: str = ""

    @property
    def running(self) -> bool:
        """Active with a main process: the state a proven restart ends in."""
        return self.active_state == "active" and self.main_pid > 0

    def describe(self) -> str:
        since = self.active_enter_at.isoformat() if self.active_enter_at else "never"
        return f"{self.active_state}/{self.sub_state} MainPID={self.main_pid} since {since}"

    def started_after(self, moment: datetime) -> bool:
        """Whether the running process was started after `moment` (a node clock reading)."""
        return self.running and self.active_enter_at is not None and self.active_enter_at > moment


@dataclass(frozen=True)
class ServiceFact(CommandFact[ServiceState]):
    """`systemctl show <unit>` of the properties that describe and prove a restart."""

    unit: str = SERVICE
    sentence = "read the state of {unit}.service"

    def command(self) -> list[str]:
        argv = ["systemctl", "show", self.unit, "--timestamp=us+utc"]
        for name in SHOW_PROPERTIES:
            argv += ["-p", name]
        return argv

    def parse(self, text: str, host: str) -> ServiceState:
        try:
            return parse_service_show(text)
        except ServiceProbeFailed as exc:
            raise ServiceProbeFailed(f"{host}: {self.unit}.service: {exc}") from exc


def parse_service_show(text: str) -> ServiceState:
    """`systemctl show -p ...` output (KEY=VALUE lines, any order) -> ServiceState."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    missing = [k for k in ("MainPID", "ActiveState", "SubState") if k not in values]
    if missing:
        raise ServiceProbeFailed(
            f"`systemctl show` printed no {', '.join(missing)}: {text.strip()[:200]!r}"
        )
    try:
        main_pid = int(values["MainPID"])
    except ValueError as exc:
        raise ServiceProbeFailed(f"MainPID is not a number: {values['MainPID']!r}") from exc
    restarts = values.get("NRestarts", "")
    return ServiceState(
        main_pid=main_pid,
        active_state=values["ActiveState"],
        sub_state=values["SubState"],
        n_restarts=whole_number(restarts),
        active_enter_at=parse_systemd_timestamp(values.get("ActiveEnterTimestamp", "")),
        invocation_id=values.get("InvocationID", ""),
    )


def parse_systemd_timestamp(text: str) -> datetime | None:
    """`Sun 2026-11-29 23:38:01.558249 UTC` -> an aware datetime; empty or `n/a` -> None."""
    text = text.strip()
    if not text or text == "n/a":
        return None
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ServiceProbeFailed(
        f"cannot read the systemd timestamp {text!r} (expected `Day YYYY-MM-DD HH:MM:SS UTC`)"
    )


# What the journal says when containerd is signalled, restarted by systemd, or fails
# (FACTS.md: SIGHUP is a restart by systemd, not a reload).
_JOURNAL_EVENTS = ("Sent signal SIGHUP", "Scheduled restart job", "Started ", "Failed with result")
MAX_JOURNAL_LINES = 50


def parse_service_journal(text: str) -> tuple[str, ...]:
    """The journal's restart, signal and failure lines, the last MAX_JOURNAL_LINES."""
    lines = [line.strip() for line in text.splitlines() if any(e in line for e in _JOURNAL_EVENTS)]
    return tuple(lines[-MAX_JOURNAL_LINES:])


@dataclass(frozen=True)
class ServiceJournalFact(CommandFact[tuple[str, ...]]):
    """`journalctl -u containerd` -> the lines telling its restarts and signals; optional."""

    unit: str = SERVICE
    optional = True
    sentence = "read the journal of {unit}.service"
    parser = staticmethod(parse_service_journal)

    def command(self) -> list[str]:
        return ["journalctl", "-u", self.unit, "--no-pager", "-q", "-o", "short-iso", "-n", "500"]
