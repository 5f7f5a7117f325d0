"""How KubeClient calls the official client: one request in, the server's JSON out.

Every request reads the raw JSON (`_preload_content=False`) instead of the client's models:
rollout needs a few fields of each object, and the JSON is what the server said, with no
model (de)serialisation in between to disagree with it. Errors are translated here, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from rollout.transports.errors import KubeError
from rollout.transports.kube.apierrors import translate_api_errors


class JsonCalls:
    """Client methods called for their JSON, each labelled (verb, object) for its errors."""

    def __init__(self, request_timeout_s: tuple[float, float]) -> None:
        self._timeout = request_timeout_s

    def request(self, verb: str, obj: str, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Call one client method and return the decoded JSON body."""
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


def plain(value: Any) -> Any:
    """Mappings (MappingProxyType included) as dicts, for the client's body validation."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
