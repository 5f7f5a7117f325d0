"""Object metadata values the API server and the simulated controllers mint: uids, names, times."""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import UTC, datetime

# Kubernetes' generated-name alphabet: no vowels (no accidental words), no 0/1/3 look-alikes.
NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def new_uid() -> str:
    """A fresh object uid, a random UUID as the real server mints."""
    return str(uuid.uuid4())


def new_name_suffix(length: int = 5) -> str:
    """The random suffix of a generated name (`generateName`, DaemonSet pods)."""
    return "".join(secrets.choice(NAME_SUFFIX_ALPHABET) for _ in range(length))


def format_timestamp(at_s: float | None = None) -> str:
    """An RFC 3339 timestamp with second precision, as metav1.Time serialises."""
    moment = datetime.fromtimestamp(time.time() if at_s is None else at_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_timestamp(at_s: float | None = None) -> str:
    """An RFC 3339 timestamp with microseconds, as metav1.MicroTime serialises."""
    moment = datetime.fromtimestamp(time.time() if at_s is None else at_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
