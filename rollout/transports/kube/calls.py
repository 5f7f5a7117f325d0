"""How KubeClient calls the official client: one request in, the server's JSON out.

Every request goes over the client's generic HTTP path (`resources.ApiRequest`, sent by
`send`) and reads the raw JSON instead of the client's models: rollout needs a few fields of
each object, and the JSON is what the server said, with no model (de)serialisation in between
to disagree with it. Errors are translated here, once.

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

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from rollout.retry import REQUEST_POLICY, RetryPolicy, call_with_policy, is_transient
from rollout.transports.errors import Conflict, KubeError
from rollout.transports.idempotence import Idempotence, classify_request
from rollout.transports.kube.apierrors import translate_api_errors
from rollout.transports.kube.resources import ApiRequest, Resource

T = TypeVar("T")
# what every generated method asks for and authenticates with
ACCEPT = "application/json"
AUTH_SETTINGS = ["BearerToken"]


def send(api: ApiClient, request: ApiRequest, timeout_s: tuple[float, float]) -> bytes:
    """Send one request as a generated client method does (the client's serialisation,
    authentication and REST layer), and return the body; ApiException for an error status."""
    headers = {"Accept": ACCEPT}
    if request.content_type is not None:
        headers["Content-Type"] = request.content_type
    serialized = api.param_serialize(
        method=request.method,
        resource_path=request.path,
        path_params=dict(request.path_params),
        query_params=list(request.query),
        header_params=headers,
        body=request.body,
        auth_settings=AUTH_SETTINGS,
    )
    response = api.call_api(*serialized, _request_timeout=timeout_s)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return data


def retryable_blindly(verb: str) -> Callable[[BaseException], bool]:
    """What an idempotent request retries: transient errors, and for a patch a 409 too (a
    merge patch carries no resourceVersion, so a conflict is the server's own, not a lost
    race)."""

    def retryable(error: BaseException) -> bool:
        return is_transient(error) or (verb == "patch" and isinstance(error, Conflict))

    return retryable


class JsonCalls:
    """Requests to one API client, read as JSON, each labelled (verb, object) for its errors."""

    def __init__(
        self,
        api: ApiClient,
        request_timeout_s: tuple[float, float],
        policy: RetryPolicy = REQUEST_POLICY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api
        self._timeout = request_timeout_s
        self.policy = policy
        self.sleep = sleep

    def request(self, verb: str, obj: str, request: ApiRequest) -> Any:
        """Make one request and return the decoded JSON body; an idempotent request is
        retried on transient errors, any other is made once (see `guarded`)."""
        if classify_request(verb) is not Idempotence.IDEMPOTENT:
            return self.request_once(verb, obj, request)
        return call_with_policy(
            lambda: self.request_once(verb, obj, request),
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

    def request_bytes(self, verb: str, obj: str, request: ApiRequest) -> bytes:
        """Make one request once and return the body as sent (a pod's log is text)."""
        with translate_api_errors(verb, obj):
            return send(self._api, request, self._timeout)

    def request_once(self, verb: str, obj: str, request: ApiRequest) -> Any:
        """Make one request once and return the decoded JSON body."""
        data = self.request_bytes(verb, obj, request)
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
        resource: Resource,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Any]:
        """The items of one namespace's list (None: every namespace's), as JSON."""
        shown = ", ".join(s for s in (label_selector, field_selector) if s)
        where = namespace or "all namespaces"
        what = f"{resource.plural} in {where}" + (f" ({shown})" if shown else "")
        request = resource.list(namespace, label_selector, field_selector)
        data = self.request("list", what, request)
        return list(data.get("items") or [])
