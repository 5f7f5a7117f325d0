"""The API server's fault hook: which request to fail, and how, from the lab's fault settings.

The settings are read from the lab's faults.json whenever the file changes (so `rollout lab
faults` acts on a running lab); every fault injected is appended to faults.log first.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rollout.lab.faults import (
    FAULT_LOG,
    FAULTS_FILE,
    READ_KINDS,
    UPDATE_METHODS,
    WATCH_KINDS,
    WRITE_KINDS,
    ApiFault,
    FaultLog,
    FaultSettings,
    allowed,
    decide,
    read_settings,
    without_random_parts,
)


@dataclass(frozen=True)
class ChosenFault:
    """A fault to inject into one request: its kind and its id in faults.log."""

    kind: ApiFault
    id: int
    settings: FaultSettings

    @property
    def message(self) -> str:
        """What the Status says: names the fault, so a client's error can be tied to it."""
        return f"injected fault #{self.id} ({self.kind.value}) by the rollout lab"


class ApiFaultInjector:
    """Decides, per request, whether the lab's settings fault it; logs what it injects."""

    def __init__(self, lab_dir: Path) -> None:
        self._lab_dir = lab_dir
        self._log = FaultLog(lab_dir / FAULT_LOG)
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._mtime: float | None = None
        self._settings = FaultSettings()

    def settings(self) -> FaultSettings:
        """The current settings, read again when faults.json changed."""
        path = self._lab_dir / FAULTS_FILE
        try:
            mtime: float | None = path.stat().st_mtime
        except OSError:
            mtime = None
        if mtime != self._mtime:
            self._settings = read_settings(self._lab_dir) if mtime is not None else FaultSettings()
            self._mtime = mtime
            self._seen.clear()  # a new seed (or the same one again) starts a new sequence
        return self._settings

    def choose(self, method: str, target: str, *, watch: bool = False) -> ChosenFault | None:
        """The fault for this request (`target`: path and query), or None to serve it."""
        with self._lock:
            settings = self.settings()
            if not settings.active:
                return None
            request = f"{method} {target}"
            key = without_random_parts(request)  # a seed faults the same requests every run
            occurrence = self._seen[key]
            self._seen[key] += 1
            if method == "GET":
                rate = settings.api_read
                kinds = WATCH_KINDS if watch else READ_KINDS
            else:
                rate = settings.api_write
                kinds = WRITE_KINDS if method in UPDATE_METHODS else READ_KINDS
            fault = decide(settings.seed, rate, key, occurrence, allowed(kinds, settings.kinds))
            if not isinstance(fault, ApiFault):
                return None
            fault_id = self._log.record("api", request, fault, occurrence=occurrence)
            return ChosenFault(fault, fault_id, settings)
