"""A run kept in the cluster, for the scheduled CronJob: its pod has no disk that outlives it.

What the next scheduled run needs is kept in one Secret named after the plan, in the
schedule's namespace: ``rollout-<plan>-run``, with the keys

- ``run-id``: the run it holds;
- ``plan.json.gz``: the plan as rendered when the run started, gzipped and base64'd
  (checked against the digest in its run-started record, as in a run directory);
- ``invocation.json``: the plan file's text and where the fleet is;
- ``journal.jsonl``, ``journal.NNNN.jsonl.gz``: the journal, the backups index included (its
  backup-written records): packed chunks, then the open one appended to;
- ``steps.json``: what each node's steps kept, ``{node: {step: data}}``.

A Secret, not a ConfigMap: the plan's text and what steps read on nodes are in it (invariant
9), and the built-in `view` and `edit`-less roles that read ConfigMaps do not read Secrets.

Every write replaces the whole Secret under the resourceVersion this process last read or
wrote. The API server answers once etcd holds the object, so an append is durable before the
executor acts; a Secret changed by anyone else meanwhile is a Conflict that stops the run
(JournalWriteFailed, loudly), never a lost record. The Lease keeps two runs from working at
once; this catches whatever slips past it.

The Secret holds one run of the plan at a time: an unfinished one is continued by the next
`rollout apply` of the same plan text (`find_run`, `open_run`); a finished one is replaced
by the next new run (`start_run`).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rollout.errors import RolloutError
from rollout.run.errors import (
    InvocationUnreadable,
    JournalError,
    JournalMismatch,
    JournalWriteFailed,
)
from rollout.run.files import INVOCATION_FILE, JOURNAL_FILE, NAME_PATTERN
from rollout.run.invocation import Invocation
from rollout.run.journal import Journal, JournalContents, check_plan, parse_journal
from rollout.run.records import Clock, Entry, RunId, parse_json_object, utc_now
from rollout.run.state import Fold, RunState
from rollout.transports.errors import Conflict, NotFound
from rollout.transports.kube import Secret
from rollout.transports.kube.objects import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    frozen_map,
)

RUN_ID_KEY = "run-id"
STEPS_KEY = "steps.json"
# plan.json, gzipped and base64'd: a rendered plan is some 17 KB a node and compresses
# about fifteenfold, and the whole Secret must stay under 1 MiB
PLAN_KEY = "plan.json.gz"
# The journal: an open chunk (`journal.jsonl`, plain, appended to) and, each time it passes
# this many characters, a packed chunk more (`journal.NNNN.jsonl.gz`): a journal compresses
# about tenfold, so 1 MiB holds some two thousand nodes', and no append sends more than the
# Secret and one chunk.
CHUNK_CHARS = 64 * 1024
_CHUNK_KEY = re.compile(r"journal\.\d{4}\.jsonl\.gz")
# The API refuses a Secret whose data passes 1 MiB; stop short of it with a clear error.
MAX_DATA_BYTES = 1024 * 1024 - 16 * 1024


class SecretApi(Protocol):
    """The three calls the cluster store makes (rollout.transports.kube.KubeClient)."""

    def get_secret(self, namespace: str, name: str) -> Secret: ...

    def create_secret(self, secret: Secret) -> Secret: ...

    def replace_secret(self, secret: Secret) -> Secret: ...


def run_object_name(plan_name: str) -> str:
    """The Secret holding the plan's run: `rollout-<plan name>-run`."""
    return f"rollout-{plan_name}-run"


@dataclass(frozen=True)
class ClusterRun:
    """The run a plan's Secret holds, read without writing (status, and apply's choice)."""

    secret: Secret
    state: RunState
    invocation: Invocation

    @property
    def run_id(self) -> RunId:
        return self.state.run_id

    @property
    def where(self) -> str:
        return _locate(self.secret)

    def entries(self) -> tuple[Entry, ...]:
        """The journal's records with their times."""
        _, (contents, _) = _read_journal(self.secret)
        return contents.entries

    def read_plan_json(self) -> str:
        """plan.json, checked against the digest in the run-started record."""
        where = _locate(self.secret, PLAN_KEY)
        return check_plan(_plan_text(self.secret), where, self.run_id, self.state.plan_digest)


def find_run(kube: SecretApi, namespace: str, plan_name: str) -> ClusterRun | None:
    """The plan's run kept in the cluster, or None when there is none yet."""
    try:
        secret = kube.get_secret(namespace, run_object_name(plan_name))
    except NotFound:
        return None
    state, _ = _read_journal(secret)
    return ClusterRun(secret, state, _read_invocation(secret, state.run_id))


def start_run(
    kube: SecretApi,
    namespace: str,
    plan_name: str,
    plan_json: str,
    *,
    invocation: Invocation,
    run_id: RunId,
    user: str | None = None,
    host: str | None = None,
    clock: Clock = utc_now,
) -> Journal:
    """A new run of the plan kept in the cluster: created with its run-started record in one
    write (plan, invocation and journal together), over a finished run of the plan if the
    Secret holds one; JournalError when it holds an unfinished run (continue that one)."""
    name = run_object_name(plan_name)
    previous = find_run(kube, namespace, plan_name)
    if previous is not None and not previous.state.finished:
        raise JournalError(
            f"{previous.where} holds run {previous.run_id}, not finished: continue it "
            f"(`rollout apply` of the same plan) rather than start another"
        )
    data = {
        RUN_ID_KEY: run_id,
        PLAN_KEY: pack_text(plan_json),
        INVOCATION_FILE: invocation.to_json().decode(),
        JOURNAL_FILE: "",
        STEPS_KEY: "{}",
    }
    secret = Secret(
        namespace,
        name,
        frozen_map(data),
        labels=frozen_map(_labels(plan_name)),
        # the first write replaces a finished run's Secret as it was read, or creates one
        resource_version=previous.secret.resource_version if previous else None,
    )
    store = SecretStore(kube, secret, run_id, created=previous is not None)
    journal = Journal(store, run_id, contents=None, clock=clock)
    journal.start(plan_name, plan_json, user=user, host=host)
    return journal


def open_run(kube: SecretApi, namespace: str, plan_name: str, *, clock: Clock = utc_now) -> Journal:
    """The plan's run kept in the cluster, open for appending (to continue it)."""
    name = run_object_name(plan_name)
    try:
        secret = kube.get_secret(namespace, name)
    except NotFound:
        raise JournalError(f"no run of plan {plan_name} in secret {namespace}/{name}") from None
    state, contents = _read_journal(secret)
    store = SecretStore(kube, secret, state.run_id, created=True)
    return Journal(store, state.run_id, contents=contents, clock=clock)


class SecretStore:
    """The RunStore of a run kept in a Secret: each write replaces it, resourceVersion-checked."""

    def __init__(self, kube: SecretApi, secret: Secret, run_id: str, *, created: bool) -> None:
        self._kube = kube
        self._secret = secret
        self._run_id = run_id
        # False until the first write, which then creates the Secret
        self._created = created
        self._lock = threading.Lock()

    @property
    def namespace(self) -> str:
        return self._secret.namespace

    @property
    def where(self) -> str:
        return _locate(self._secret)

    @property
    def plan_location(self) -> str:
        return _locate(self._secret, PLAN_KEY)

    def append_journal(self, line: bytes) -> None:
        with self._lock:
            journal = self._secret.data.get(JOURNAL_FILE, "") + line.decode()
            if len(journal) <= CHUNK_CHARS:
                self._write({JOURNAL_FILE: journal})
                return
            # the open chunk is full: packed, in one write with the emptied open chunk
            closed = chunk_key(len(closed_chunks(self._secret)))
            self._write({closed: pack_text(journal), JOURNAL_FILE: ""})

    def read_plan_text(self) -> str:
        return _plan_text(self._secret)

    def read_invocation(self) -> Invocation:
        return _read_invocation(self._secret, self._run_id)

    def save_step_data(self, node: str, step: str, data: Mapping[str, Any]) -> None:
        for what, name in (("node", node), ("step", step)):
            if not NAME_PATTERN.fullmatch(name):
                raise JournalError(f"{what} name {name!r} cannot name step data in {self.where}")
        with self._lock:
            steps = self._steps()
            steps.setdefault(node, {})[step] = dict(data)
            self._write({STEPS_KEY: json.dumps(steps, sort_keys=True)})

    def load_step_data(self, node: str, step: str) -> dict[str, Any]:
        with self._lock:
            found = self._steps().get(node, {}).get(step)
        return dict(found) if isinstance(found, dict) else {}

    def close(self) -> None:
        """Nothing is held: the Lease, not the Secret, says who works on the cluster."""

    def _steps(self) -> dict[str, Any]:
        try:
            return parse_json_object(self._secret.data.get(STEPS_KEY, "{}").encode())
        except ValueError as e:
            raise JournalError(
                f"{self.where}: key {STEPS_KEY} {e}; only rollout writes it: start a new run"
            ) from None

    def _write(self, changed: Mapping[str, str]) -> None:
        secret = self._secret.with_data({**self._secret.data, **changed})
        size = sum(len(k) + len(v.encode()) for k, v in secret.data.items())
        if size > MAX_DATA_BYTES:
            raise JournalWriteFailed(
                f"run {self._run_id}: {self.where} would hold {size} bytes, over the "
                f"{MAX_DATA_BYTES} a Secret may: the run has too many nodes to keep in the "
                "cluster; split the plan into plans of fewer nodes (nothing was done past the "
                "last record stored)"
            )
        try:
            if self._created:
                written = self._kube.replace_secret(secret)
            else:
                written = self._kube.create_secret(secret)
        except Conflict as e:
            raise JournalWriteFailed(
                f"run {self._run_id}: {self.where} was changed by another writer since this "
                f"run last wrote it ({e}): another run of this plan may be working; stop it, "
                "then run `rollout apply` of the plan again to continue from what is stored"
            ) from e
        except RolloutError as e:
            raise JournalWriteFailed(
                f"run {self._run_id}: could not write {self.where}: {e}"
            ) from e
        self._secret, self._created = written, True


def pack_text(text: str) -> str:
    """Text as the Secret keeps it packed: gzip (mtime 0: the same text packs the same), base64."""
    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def unpack_text(packed: str, where: str) -> str:
    """Packed text back; JournalMismatch, naming `where`, when it cannot be unpacked."""
    try:
        return gzip.decompress(base64.b64decode(packed, validate=True)).decode()
    except (ValueError, OSError, EOFError) as e:
        raise JournalMismatch(
            f"{where}: it cannot be read ({e}); only rollout writes it: start a new run"
        ) from None


def _plan_text(secret: Secret) -> str:
    """The Secret's plan.json, unpacked (not checked); JournalMismatch when it cannot be."""
    where = f"{_locate(secret, PLAN_KEY)}, the plan the run started with,"
    return unpack_text(secret.data.get(PLAN_KEY, ""), where)


def chunk_key(index: int) -> str:
    return f"journal.{index:04d}.jsonl.gz"


def closed_chunks(secret: Secret) -> list[str]:
    """The keys of the journal's packed chunks, in order."""
    keys = sorted(k for k in secret.data if _CHUNK_KEY.fullmatch(k))
    expected = [chunk_key(i) for i in range(len(keys))]
    if keys != expected:
        where = _locate(secret)
        raise JournalError(
            f"{where}: the journal's chunks are {', '.join(keys)}, not {', '.join(expected)}:"
            " one is missing; only rollout writes them: start a new run"
        )
    return keys


def journal_text(secret: Secret) -> str:
    """The whole journal a Secret holds: its packed chunks, then the open one."""
    packed = [unpack_text(secret.data[k], _locate(secret, k)) for k in closed_chunks(secret)]
    return "".join(packed) + secret.data.get(JOURNAL_FILE, "")


def _read_journal(secret: Secret) -> tuple[RunState, tuple[JournalContents, Fold]]:
    contents, fold = parse_journal(journal_text(secret).encode(), f"{_locate(secret)} (journal)")
    return fold.freeze(contents.notes), (contents, fold)


def _read_invocation(secret: Secret, run_id: str) -> Invocation:
    where = _locate(secret, INVOCATION_FILE)
    text = secret.data.get(INVOCATION_FILE)
    if text is None:
        raise InvocationUnreadable(run_id, where, "is missing")
    try:
        return Invocation.from_json(text.encode())
    except ValueError as e:
        raise InvocationUnreadable(run_id, where, str(e)) from None


def _labels(plan_name: str) -> dict[str, str]:
    return {
        LABEL_NAME: "rollout",
        LABEL_INSTANCE: plan_name,
        LABEL_COMPONENT: "run-state",
        LABEL_MANAGED_BY: "rollout",
    }


def _locate(secret: Secret, key: str | None = None) -> str:
    """Where a run kept in the cluster is, for messages: its Secret, and the key if one is meant."""
    where = f"secret {secret.namespace}/{secret.name}"
    return where if key is None else f"{where} (key {key})"
