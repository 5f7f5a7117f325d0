"""How KubeClient calls the official client: one request in, the server's JSON out.

Every request reads the raw JSON (`_preload_content=False`) instead of the client's models:
rollout needs a few fields of each object, and the JSON is what the server said, with no
model (de)serialisation in between to disagree with it. Errors are translated here, once.

Requests are retried here by their class (rollout.transports.idempotence): an idempotent one
(a read, a merge patch) under the request policy; a checked one (create, replace, evict,
delete) through `guarded`, which re-reads fresh state before each retry and stops when the
effect is already there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rollout.retry import REQUEST_POLICY, RetryPolicy, call_with_policy, is_transient
from rollout.transports.errors import Conflict, KubeError
from rollout.transports.idempotence import Idempotence, classify_request
from rollout.transports.kube.apierrors import translate_api_errors

T = TypeVar("T")


def retryable_blindly(verb: str) -> Callable[[BaseException], bool]:
    """What an idempotent request retries: transient errors, and for a patch a 409 too (a
    merge patch carries no resourceVersion, so a conflict is the server's own, not a lost
    race)."""

    def retryable(error: BaseException) -> bool:
        return is_transient(error) or (verb == "patch" and isinstance(error, Conflict))

    return retryable


class JsonCalls:
    """Client methods called for their JSON, each labelled (verb, object) for its errors."""

    def __init__(
        self,
        request_timeout_s: tuple[float, float],
        policy: RetryPolicy = REQUEST_POLICY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._timeout = request_timeout_s
        self.policy = policy
        self.sleep = sleep

    def request(self, verb: str, obj: str, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Call one client method and return the decoded JSON body; an idempotent request
        is retried on transient errors, any other is made once (see `guarded`)."""
        if classify_request(verb) is not Idempotence.IDEMPOTENT:
            return self.request_once(verb, obj, call, *args, **kw)
        return call_with_policy(
            lambda: self.request_once(verb, obj, call, *args, **kw),
            self.policy,
            sleep=self.sleep,
            operation=f"{verb} {obj}",
            retry_on=retryable_blindly(verb),
        )

    def retried(self, verb: str, obj: str, op: Callable[[], T]) -> T:
        """Any idempotent operation (a log read) under the request policy."""
        return call_with_policy(
            op, self.policy, sleep=self.sleep, operation=f"{verb} {obj}", retry_on=is_transient
        )

    def guarded(
        self,
        verb: str,
        obj: str,
        act: Callable[[], T],
        recheck: Callable[[BaseException], T | None],
        retry_on: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """A request that must not be done twice: made once; after a failure `retry_on`
        accepts, `recheck(error)` reads fresh state first and returns the result when the
        effect is already there (the lost answer), or None to make the request again."""
        failed: list[BaseException] = []

        def attempt() -> T:
            if failed:
                found = recheck(failed[-1])
                if found is not None:
                    return found
            try:
                return act()
            except Exception as error:
                failed.append(error)
                raise

        return call_with_policy(
            attempt, self.policy, sleep=self.sleep, operation=f"{verb} {obj}", retry_on=retry_on
        )

    def request_once(
        self, verb: str, obj: str, call: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """Call one client method once and return the decoded JSON body."""
        with translate_api_errors(verb, obj):
            response = call(*args, _preload_content=False, _request_timeout=self._timeout, **kw)
            data = response.data
        if not data:
            return {}
        try:
            return json.loads(data)
        except ValueError as exc:
            raise KubeError(
                verb,
                obj,
                reason="unreadable response",
                message=data[:200].decode("utf-8", "replace"),
            ) from exc

    def list_in(
        self,
        kind: str,
        namespace: str | None,
        namespaced: Callable[..., Any],
        everywhere: Callable[..., Any],
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Any]:
        """The items of one namespace's list (None: every namespace's), as JSON."""
        shown = ", ".join(s for s in (label_selector, field_selector) if s)
        what = f"{kind} in {namespace or 'all namespaces'}" + (f" ({shown})" if shown else "")
        selectors = {"label_selector": label_selector, "field_selector": field_selector}
        if namespace is None:
            data = self.request("list", what, everywhere, **selectors)
        else:
            data = self.request("list", what, namespaced, namespace, **selectors)
        return list(data.get("items") or [])

    # The client's namespaced calls take (name, namespace[, body]) to read or replace and
    # (namespace, body) to create; these three keep that order, and the label, in one place.

    def read_namespaced(
        self, kind: str, call: Callable[..., Any], namespace: str, name: str
    ) -> Any:
        return self.request("get", f"{kind} {namespace}/{name}", call, name, namespace)

    def create_namespaced(
        self, kind: str, call: Callable[..., Any], namespace: str, name: str, body: Any
    ) -> Any:
        return self.request("create", f"{kind} {namespace}/{name}", call, namespace, body)

    def replace_namespaced(
        self, kind: str, call: Callable[..., Any], namespace: str, name: str, body: Any
    ) -> Any:
        return self.request("replace", f"{kind} {namespace}/{name}", call, name, namespace, body)
