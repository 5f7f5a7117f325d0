"""The errors the transports raise, translated from paramiko, fabric, socket and kubernetes.

This module imports none of those libraries, so the executor, the steps and the CLI can catch
`NotFound` or `HostKeyMismatch` without importing them (the layering rule of STYLE.md).

The errors that may go away by themselves derive from rollout.errors.TransientError, the
marker the retry policies (rollout.retry) know; each error names its own kind of retry
(`retry_kind`), so the policies import nothing from here.
"""

from __future__ import annotations

from rollout.errors import BadInput, RolloutError, TransientError
from rollout.inputs.wholenumber import whole_number

# A Status message or an unparsed body longer than this is cut: a 500 can carry a whole
# HTML page or a stack trace, and a user needs its first lines, not a screenful.
MAX_MESSAGE_CHARS = 500


def truncate_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


# ---------------------------------------------------------------------------------- SSH


class SshError(RolloutError):
    """Something went wrong talking SSH to a node (not a command's own non-zero exit)."""

    def __init__(self, node: str, target: str, problem: str, hint: str | None = None) -> None:
        self.node = node
        self.target = target
        self.problem = problem
        self.hint = hint
        text = f"node {node} ({target}): {problem}"
        super().__init__(text + (f"\n  hint: {hint}" if hint else ""))

    def retry_kind(self) -> str:
        return "ssh"


class SshConnectError(SshError, TransientError):
    """The node could not be reached, or the connection dropped: refused, reset, timed out."""


class SshResolveError(SshError):
    """The node's address does not resolve: a typo in the inventory more often than not."""


class SshAuthError(SshError):
    """The node refused every key offered: wrong user, key or authorized_keys."""


class SshProtocolError(SshError):
    """The SSH session failed for another reason: a refused channel, a protocol error."""


class HostKeyError(SshError):
    """The node's host key is not the one known_hosts records (or none is recorded)."""

    def __init__(
        self, node: str, target: str, where: tuple[str, str, str], problem: str, hint: str
    ) -> None:
        # where: (known_hosts file, its entry for the node, the key's type)
        self.known_hosts, self.entry, self.key_type = where
        super().__init__(node, target, problem, hint=hint)


class HostKeyUnknown(HostKeyError):
    """The node's host key is not in known_hosts and adding unknown keys was not asked for."""

    def __init__(
        self, node: str, target: str, known_hosts: str, entry: str, key_type: str, fingerprint: str
    ) -> None:
        self.fingerprint = fingerprint
        host, port = split_known_hosts_entry(entry)
        keyscan = f"ssh-keyscan -p {port} {host}" if port != 22 else f"ssh-keyscan {host}"
        super().__init__(
            node,
            target,
            (known_hosts, entry, key_type),
            f"the host key of {entry} is not in {known_hosts} ({key_type} {fingerprint})",
            hint=f"check the fingerprint, then add the key (`{keyscan} >> {known_hosts}`) "
            "or accept new host keys explicitly (--accept-new-host-keys)",
        )


class HostKeyMismatch(HostKeyError):
    """The node presented a key other than the one known_hosts records for it.

    Never accepted, whatever the options: it is either a reinstalled node or a
    man in the middle, and only a person can tell which.
    """

    def __init__(
        self,
        node: str,
        target: str,
        known_hosts: str,
        entry: str,
        key_type: str,
        presented: str,
        expected: str,
    ) -> None:
        self.presented = presented
        self.expected = expected
        super().__init__(
            node,
            target,
            (known_hosts, entry, key_type),
            f"HOST KEY CHANGED for {entry}: the node presented {key_type} {presented}, "
            f"{known_hosts} expects {expected}",
            hint="if the node was reinstalled, remove the old key "
            f"(`ssh-keygen -R '{entry}' -f {known_hosts}`) and add the new one; "
            "otherwise treat it as an attack and stop",
        )


def known_hosts_entry(host: str, port: int) -> str:
    """How known_hosts names a host: `host` on port 22, `[host]:port` elsewhere."""
    return host if port == 22 else f"[{host}]:{port}"


def split_known_hosts_entry(entry: str) -> tuple[str, int]:
    """`[host]:port` -> (host, port); a bare host -> (host, 22)."""
    if entry.startswith("[") and "]:" in entry:
        host, _, port = entry[1:].partition("]:")
        number = whole_number(port)
        if number is not None:
            return host, number
    return entry, 22


# --------------------------------------------------------------------------- Kubernetes


class KubeError(RolloutError):
    """A Kubernetes API request failed; says which request, the status and the server's word."""

    hint: str | None = None
    # The server's Retry-After header, in seconds (0: none); a retry waits at least this long.
    retry_after_s: float = 0.0

    def __init__(
        self,
        verb: str,
        obj: str,
        *,
        status: int | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        self.verb = verb
        self.obj = obj
        self.status = status
        self.reason = reason
        self.message = truncate_text(message)
        code = f"{status} {reason}".strip() if status is not None else reason
        text = ": ".join(part for part in (f"{verb} {obj}", code, self.message) if part)
        self.hint = self.advice()
        super().__init__(text + (f"\n  hint: {self.hint}" if self.hint else ""))

    def advice(self) -> str | None:
        """What the user can do about it: the class's hint unless a subclass knows better."""
        return type(self).hint

    def retry_kind(self) -> str:
        return f"api {self.status}" if self.status is not None else type(self).__name__


class KubeConfigError(KubeError, BadInput):
    """No usable kubeconfig or in-cluster configuration (bad input: exit code 2)."""

    hint = "pass --kubeconfig/--context, set KUBECONFIG, or check ~/.kube/config"


class KubeUnreachable(KubeError, TransientError):
    """The API server could not be reached: connection refused, reset or timed out."""

    hint = "check that the API server in the kubeconfig is up and reachable from here"

    def retry_kind(self) -> str:
        return "api timeout" if "timed out" in str(self).lower() else "api unreachable"


class BadRequest(KubeError):
    """400: the server rejected the request as malformed."""


class Unauthorized(KubeError):
    """401: the credentials were refused."""

    hint = "the kubeconfig's credentials are missing or expired; log in again"


class Forbidden(KubeError):
    """403: the credentials are valid but RBAC does not allow this request."""

    def advice(self) -> str:
        return rbac_hint(self.verb, self.obj)


# How the client's requests name objects (first word) -> the RBAC resource (and API group).
_RBAC_RESOURCES = {
    "node": "nodes",
    "nodes": "nodes",
    "pod": "pods",
    "pods": "pods",
    "configmap": "configmaps",
    "event": "events",
    "lease": "leases.coordination.k8s.io",
    "poddisruptionbudgets": "poddisruptionbudgets.policy",
    "clusterpolicy": "clusterpolicies.nvidia.com",
    "clusterpolicies": "clusterpolicies.nvidia.com",
    "nvidiadriver": "nvidiadrivers.nvidia.com",
    "nvidiadrivers": "nvidiadrivers.nvidia.com",
}
# Requests whose RBAC verb, or subresource, is not the request's own verb.
_RBAC_REQUESTS = {
    "replace": ("update", ""),
    "evict": ("create", "/eviction"),
    "read log of": ("get", "/log"),
}


def rbac_hint(verb: str, obj: str) -> str:
    """What to grant for a refused request: `patch` on `nodes`, `create` on `pods/eviction`."""
    words = obj.split()
    resource = _RBAC_RESOURCES.get(words[0], words[0]) if words else obj
    rbac_verb, subresource = _RBAC_REQUESTS.get(verb, (verb, ""))
    if subresource:
        resource = resource.split(".")[0] + subresource
    after_in = words[words.index("in") + 1 :] if "in" in words else []
    if after_in[:2] == ["all", "namespaces"]:
        scope, flag = " in every namespace", " --all-namespaces"
    elif len(words) > 1 and "/" in words[1]:  # `pod ns/name`
        scope, flag = f" in namespace {words[1].split('/')[0]}", f" -n {words[1].split('/')[0]}"
    elif after_in:  # `pods in ns`
        scope, flag = f" in namespace {after_in[0]}", f" -n {after_in[0]}"
    else:
        scope, flag = "", ""
    # kubectl reads `pods/eviction` as the pod named "eviction": a subresource is a flag
    base, _, sub = resource.partition("/")
    check = f"{base} --subresource={sub}" if sub else base
    return (
        f"grant the user or service account `{rbac_verb}` on `{resource}`{scope} "
        f"(a Role or ClusterRole rule and its binding); "
        f"`kubectl auth can-i {rbac_verb} {check}{flag}` checks it"
    )


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: the object exists already, or changed since it was read (stale resourceVersion)."""


class ChangedByAnother(Conflict):
    """A replace that failed (or whose answer was lost) on an object another writer changed
    since it was read: rollout must read it again and decide again, never retry blindly."""


class Invalid(KubeError):
    """422: the object failed validation."""


class TooManyRequests(KubeError, TransientError):
    """429: throttled (or, for evictions, see EvictionBlocked); try again later."""


class EvictionBlocked(TooManyRequests):
    """An eviction refused because a PodDisruptionBudget allows no disruption now.

    Transient: the budget allows it again once other pods are healthy. A drain retries
    it on its own schedule.
    """

    def __init__(
        self, verb: str, obj: str, *, status: int, reason: str, message: str, pdb: str | None
    ) -> None:
        self.pdb = pdb
        super().__init__(verb, obj, status=status, reason=reason, message=message)


class ServerError(KubeError, TransientError):
    """5xx: the server failed; often gone on the next try."""


_STATUS_ERRORS: dict[int, type[KubeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: TooManyRequests,
}


def kube_error_class(status: int | None) -> type[KubeError]:
    """The error class for a request that failed with HTTP `status` (None: no response)."""
    if status is not None and 500 <= status <= 599:
        return ServerError
    return _STATUS_ERRORS.get(status or 0, KubeError)
