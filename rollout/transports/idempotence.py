"""Which operations may simply be repeated after a transient failure, and which may not.

Every Kubernetes request rollout makes and every remote command it runs is classified here:

- IDEMPOTENT: doing it twice leaves the same state as doing it once (a read, a merge patch
  that sets fixed values). The transports retry these under the request policy.
- CHECKED: doing it twice would do something twice (a create, a replace guarded by a
  resourceVersion, an eviction, a file replaced, a service restarted). A failure whose
  outcome is unknown (the answer was lost) is retried only after fresh state shows the
  effect is not there: the transport re-reads the object it creates, replaces or evicts
  (KubeClient); a step re-reads the file's hash or the service's MainPID (rollout.steps),
  under the executor's step retry.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class Idempotence(enum.Enum):
    IDEMPOTENT = "idempotent"
    CHECKED = "re-checked before a retry"


# The verbs KubeClient names its requests with (see rollout.transports.kube.calls).
API_VERBS: dict[str, Idempotence] = {
    "get": Idempotence.IDEMPOTENT,
    "list": Idempotence.IDEMPOTENT,
    "read log of": Idempotence.IDEMPOTENT,
    # rollout's patches are merge patches of fixed values: applying one twice is applying it
    "patch": Idempotence.IDEMPOTENT,
    "create": Idempotence.CHECKED,
    "replace": Idempotence.CHECKED,
    "delete": Idempotence.CHECKED,
    "evict": Idempotence.CHECKED,
}


def classify_request(verb: str) -> Idempotence:
    """An API request's class by its verb; an unknown verb is never retried blindly."""
    return API_VERBS.get(verb, Idempotence.CHECKED)


# Programs that only read the node, whatever their arguments.
_READING_PROGRAMS = frozenset(
    {
        "cat",
        "date",
        "journalctl",
        "nvidia-smi",
        "readlink",
        "sha256sum",
        "stat",
        "test",
        "true",
        "uname",
        "dpkg-query",
        "lsmod",
        "modinfo",
        "id",
    }
)
# `systemctl VERB`: the verbs that read.
_READING_SYSTEMCTL = frozenset({"show", "is-active", "is-enabled", "status", "cat"})
# The scripts rollout runs with `sh -c SCRIPT NAME ...`, by NAME ($0), that only read.
_READING_SCRIPTS = frozenset({"rollout-read", "rollout-dirs"})


def classify_command(argv: Sequence[str]) -> Idempotence:
    """A remote command's class; anything not known to only read is CHECKED."""
    if not argv:
        return Idempotence.CHECKED
    program = argv[0].rsplit("/", 1)[-1]
    if program in _READING_PROGRAMS:
        return Idempotence.IDEMPOTENT
    if program == "systemctl" and len(argv) > 1 and argv[1] in _READING_SYSTEMCTL:
        return Idempotence.IDEMPOTENT
    if program == "sh" and len(argv) > 3 and argv[1] == "-c" and argv[3] in _READING_SCRIPTS:
        return Idempotence.IDEMPOTENT
    if program == "find" and not {"-delete", "-exec", "-execdir", "-fprint"} & set(argv):
        return Idempotence.IDEMPOTENT
    if program == "containerd":
        words = [a for a in argv[1:] if not a.startswith("--config") and a != "-c"]
        if "--version" in words or (words[-1:] == ["dump"] and "config" in words):
            return Idempotence.IDEMPOTENT
    return Idempotence.CHECKED
