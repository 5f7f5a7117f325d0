"""The HTTP side: one request in, a JSON (or text, or watch-stream) response out."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol, cast
from urllib.parse import parse_qs, urlsplit

import yaml

from rollout.lab.apiserver.authentication import Authenticator
from rollout.lab.apiserver.errors import ApiError, StatusReason
from rollout.lab.apiserver.faults import ApiFaultInjector, ChosenFault
from rollout.lab.apiserver.impersonation import impersonate
from rollout.lab.apiserver.openapi import to_openapi_document, to_openapi_root
from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.protobuf import MEDIA_TYPE, can_decode, decode_object, is_protobuf
from rollout.lab.apiserver.rbac import (
    ANONYMOUS,
    RequestAttributes,
    UserInfo,
    is_allowed,
    list_rules,
)
from rollout.lab.apiserver.registry import DeleteOptions, Registry
from rollout.lab.apiserver.resources import (
    PODS,
    SELFSUBJECTACCESSREVIEWS,
    SELFSUBJECTREVIEWS,
    SELFSUBJECTRULESREVIEWS,
    ResourceKind,
)
from rollout.lab.apiserver.reviews import review_self, review_self_access, review_self_rules
from rollout.lab.apiserver.routes import Endpoint, Route, parse_route
from rollout.lab.apiserver.selectors import FieldSelector, LabelSelector
from rollout.lab.apiserver.store import ObjectKey, RevisionExpired, WatchEventType
from rollout.lab.apiserver.tables import to_table, wants_table
from rollout.lab.apiserver.watch import ListOptions, to_bookmark
from rollout.lab.faults import ApiFault

log = logging.getLogger("rollout.lab.apiserver")

SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-rollout-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_TRUE = ("1", "true", "True")
# How often a followed log is read again for what was written since.
_LOG_POLL_S = 0.1
# How often a quiet watch wakes to notice a stopping server or a passed deadline.
_WATCH_POLL_S = 0.5


@dataclass(frozen=True)
class Reply:
    """A finished (non-streaming) response."""

    code: int
    body: dict[str, Any] | str

    def to_bytes(self) -> tuple[bytes, str]:
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain"
        return json.dumps(self.body).encode(), "application/json"


class ApiServing(Protocol):
    """What a handler reads of the server that accepted its connection (server.ApiHttpServer,
    which imports this module: the handler knows it only by this, so no import circle)."""

    registry: Registry
    authenticator: Authenticator
    faults: ApiFaultInjector | None
    bookmark_interval_s: float
    stopping: bool

    @property
    def server_address(self) -> Any: ...


class ApiRequestHandler(BaseHTTPRequestHandler):
    """Serves the Kubernetes REST API from the server's registry."""

    protocol_version = "HTTP/1.1"
    # The caller of the request being served.
    _user: UserInfo = ANONYMOUS
    # The query of a watch that streams Tables, None for one that streams objects.
    _watch_table: dict[str, str] | None = None
    # A watch the lab's faults cut after its first events.
    _cut_watch: bool = False

    @property
    def api(self) -> ApiServing:
        """The server that accepted this connection, as the handler uses it."""
        return cast(ApiServing, self.server)

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle plus the client's
        # delayed ACK adds ~40 ms to every kept-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # ---------------------------------------------------------------- dispatch

    def _handle(self, method: str) -> None:
        self._cut_watch = False
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._read_body()
            route = parse_route(url.path, self.api.registry.catalog)
            self._user = self._authorize(method, url.path, route, query)
            if body and is_protobuf(self.headers.get("Content-Type") or ""):
                _check_protobuf_readable(route)
            watch = (
                method == "GET"
                and route.endpoint is Endpoint.RESOURCE
                and route.name is None
                and query.get("watch") in ("1", "true", "True")
            )
            fault = self._choose_fault(method, route, watch)
            if fault is not None and self._inject_before(fault):
                return
            if watch:
                self._serve_watch(route, query)
                return
            if method == "GET" and route.subresource == "log" and query.get("follow") in _TRUE:
                self._follow_log(route, query)
                return
            reply = self._dispatch(method, route, query, body)
            if fault is not None and fault.kind is ApiFault.SLOW:
                # done, but answered after the client stopped waiting
                time.sleep(fault.settings.slow_s)
        except ApiError as error:
            reply = Reply(error.code, error.to_status())
            if error.retry_after_s:
                self._send(reply, {"Retry-After": str(error.retry_after_s)})
                return
        except Exception as error:  # a bug here must not kill the connection silently
            log.exception("internal error serving %s %s", method, self.path)
            reply = Reply(500, ApiError.internal(str(error)).to_status())
        self._send(reply)

    # ------------------------------------------------------------------ faults

    def _choose_fault(self, method: str, route: Route, watch: bool) -> ChosenFault | None:
        """The lab's fault for this request, if any; only resource requests are faulted."""
        injector = self.api.faults
        if injector is None or route.endpoint is not Endpoint.RESOURCE:
            return None
        return injector.choose(method, self.path, watch=watch)

    def _inject_before(self, fault: ChosenFault) -> bool:
        """Fail the request before serving it; False for faults that act later (slow, cut)."""
        match fault.kind:
            case ApiFault.SLOW:
                return False
            case ApiFault.WATCH_CUT:
                self._cut_watch = True
                return False
            case ApiFault.RESET:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    # an RST rather than a FIN: the client reads "connection reset by peer"
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                return True
            case ApiFault.THROTTLED:
                raise ApiError(
                    StatusReason.TOO_MANY_REQUESTS,
                    fault.message,
                    details={"retryAfterSeconds": fault.settings.retry_after_s},
                    retry_after_s=fault.settings.retry_after_s,
                )
            case ApiFault.UNAVAILABLE:
                raise ApiError(StatusReason.SERVICE_UNAVAILABLE, fault.message)
            case ApiFault.CONFLICT:
                raise ApiError(StatusReason.CONFLICT, fault.message)
            case _:
                raise ApiError(StatusReason.INTERNAL_ERROR, fault.message)

    def _authorize(self, method: str, path: str, route: Route, query: dict[str, str]) -> UserInfo:
        """Authenticate, then authorize the request (401 or 403 Status as the real server)."""
        store = self.api.registry.store
        caller = self.api.authenticator.authenticate(self.headers.get("Authorization"), store)
        user = impersonate(
            self.headers,
            caller,
            lambda attributes: is_allowed(store, caller, attributes),
            request_uri=self.path,
        )
        if route.endpoint is Endpoint.RESOURCE:
            attributes = RequestAttributes.for_resource(
                method,
                route.require_kind(),
                route.namespace,
                route.name,
                route.subresource,
                watch=query.get("watch") in ("1", "true", "True"),
            )
        else:
            attributes = RequestAttributes.for_path(method, path)
        if not is_allowed(store, user, attributes):
            raise attributes.forbidden(user)
        return user

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self, method: str, route: Route, query: dict[str, str], raw: bytes) -> Reply:
        catalog = self.api.registry.catalog
        match route.endpoint:
            case Endpoint.HEALTH:
                return Reply(200, "ok")
            case Endpoint.VERSION:
                return Reply(200, dict(SERVER_VERSION))
            case Endpoint.API_VERSIONS:
                host, port = self.api.server_address[:2]
                address = f"{host!s}:{port}"
                return Reply(200, catalog.to_api_versions(address))
            case Endpoint.GROUP_LIST:
                return Reply(200, catalog.to_api_group_list())
            case Endpoint.GROUP:
                return Reply(200, catalog.to_api_group(route.group))
            case Endpoint.RESOURCE_LIST:
                return Reply(200, catalog.to_resource_list(route.group, route.version))
            case Endpoint.OPENAPI_V3 if route.version:
                return Reply(200, to_openapi_document(catalog, route.group, route.version))
            case Endpoint.OPENAPI_V3:
                return Reply(200, to_openapi_root(catalog))
        if method != "GET" and route.endpoint is not Endpoint.RESOURCE:
            raise ApiError.method_not_allowed()
        return self._dispatch_resource(method, route, query, raw)

    def _read_review(self, method: str, name: str | None, raw: bytes) -> Any:
        """The body of a self review: created only (a POST to the collection), sent as JSON
        or, as kubectl sends it, as protobuf."""
        _require_create(method, name)
        return self._decode_body(raw)

    def _dispatch_resource(
        self, method: str, route: Route, query: dict[str, str], raw: bytes
    ) -> Reply:
        registry = self.api.registry
        kind = route.require_kind()
        namespace, name = route.namespace, route.name
        if kind.namespaced and namespace is None and name is not None:
            raise ApiError.path_not_found()
        dry_run = query.get("dryRun") == "All"
        if kind == SELFSUBJECTACCESSREVIEWS:
            body = self._read_review(method, name, raw)
            user = self._user

            def decide(attributes: RequestAttributes) -> bool:
                return is_allowed(registry.store, user, attributes)

            return Reply(201, review_self_access(body, decide))
        if kind == SELFSUBJECTRULESREVIEWS:
            body = self._read_review(method, name, raw)
            caller = self._user
            return Reply(
                201, review_self_rules(body, lambda ns: list_rules(registry.store, caller, ns))
            )
        if kind == SELFSUBJECTREVIEWS:
            _require_create(method, name)
            return Reply(201, review_self(self._user))
        table = method == "GET" and wants_table(self.headers.get("Accept") or "")
        if name is None:
            if method == "GET":
                ListOptions.from_query(query)
                listed = registry.list_collection(kind, namespace, *_selectors(query))
                if table:
                    return Reply(200, _to_table(kind, listed["items"], query, listed))
                return Reply(200, listed)
            if method == "POST":
                if kind.namespaced and namespace is None:
                    raise ApiError.method_not_allowed()
                created = registry.create(kind, namespace, self._decode_body(raw), dry_run=dry_run)
                return Reply(201, created)
            raise ApiError.method_not_allowed()
        sub = route.subresource
        if sub == "token":
            if method != "POST":
                raise ApiError.method_not_allowed()
            account = registry.get(kind, namespace, name)
            request = self._decode_body(raw) if raw.strip() else None
            return Reply(201, self.api.authenticator.request_token(account, request))
        if sub == "log":
            if method != "GET":
                raise ApiError.method_not_allowed()
            tail = query.get("tailLines")
            return Reply(
                200,
                registry.read_log(
                    str(namespace),
                    name,
                    query.get("container"),
                    int(tail) if tail else None,
                ),
            )
        if sub == "eviction":
            if method != "POST":
                raise ApiError.method_not_allowed()
            return Reply(201, registry.evict(str(namespace), name, self._decode_body(raw)))
        if method == "GET":
            found = registry.get(kind, namespace, name)
            return Reply(200, _to_table(kind, [found], query) if table and sub is None else found)
        if method == "PUT":
            replaced = registry.replace(
                kind, namespace, name, self._decode_body(raw), subresource=sub, dry_run=dry_run
            )
            return Reply(200, replaced)
        if method == "PATCH":
            patch_type = PatchType.from_content_type(
                self.headers.get("Content-Type") or "", custom=kind.custom
            )
            if patch_type is PatchType.APPLY and sub is None:
                manager = query.get("fieldManager") or ""
                if not manager:
                    raise ApiError.bad_request("fieldManager is required for apply requests")
                applied, is_new = registry.apply(
                    kind, namespace, name, _decode_yaml(raw), manager, dry_run=dry_run
                )
                return Reply(201 if is_new else 200, applied)
            patched = registry.patch(
                kind, namespace, name, patch_type, _decode(raw), subresource=sub, dry_run=dry_run
            )
            return Reply(200, patched)
        if method == "DELETE" and sub is None:
            options = DeleteOptions.from_request(query, _decode(raw) if raw.strip() else None)
            return Reply(200, registry.delete(kind, namespace, name, options))
        raise ApiError.method_not_allowed()

    # ------------------------------------------------------------------ watch

    def _serve_watch(self, route: Route, query: dict[str, str]) -> None:
        registry = self.api.registry
        kind = route.require_kind()
        labels, fields = _selectors(query)
        registry.check_field_selector(kind, fields)
        options = ListOptions.from_query(query)
        # kubectl get -w asks for Tables: each event's object is then a one-row Table.
        self._watch_table = query if wants_table(self.headers.get("Accept") or "") else None
        deadline = time.monotonic() + options.timeout_s
        with registry.store.locked():
            start = options.start(registry.store.revision)
            initial = registry.list_objects(kind, route.namespace) if start.initial_state else []
        since = start.revision
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Keys of objects the client has seen matching, so that leaving the selector reads as
        # DELETED and entering it as ADDED, as the real watch cache reports.
        matching: set[ObjectKey] = set()
        try:
            for obj in initial:
                if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj):
                    key = ObjectKey.from_kind(
                        kind, obj["metadata"].get("namespace"), obj["metadata"]["name"]
                    )
                    matching.add(key)
                    self._write_event("ADDED", kind, obj)
            if start.end_bookmark:
                self._write_bookmark(kind, since, initial_events_end=True)
            bookmark_due = time.monotonic() + self.api.bookmark_interval_s
            while not self.api.stopping and time.monotonic() < deadline:
                wait_s = min(_WATCH_POLL_S, max(0.0, deadline - time.monotonic()))
                try:
                    events, since = registry.store.wait_events(kind, route.namespace, since, wait_s)
                except RevisionExpired as expired:
                    error = ApiError.expired(str(expired)).to_status()
                    self._write_chunk({"type": "ERROR", "object": error})
                    break
                if self._cut_watch:
                    # the stream ends mid-way, with no terminating chunk: a cut connection
                    self.close_connection = True
                    return
                for event in events:
                    selected = labels.matches(
                        event.obj["metadata"].get("labels")
                    ) and fields.matches(event.obj)
                    was = event.key in matching
                    if event.type is WatchEventType.DELETED:
                        matching.discard(event.key)
                        if was or selected:
                            self._write_event("DELETED", kind, event.obj)
                    elif selected:
                        matching.add(event.key)
                        self._write_event("MODIFIED" if was else "ADDED", kind, event.obj)
                    elif was:
                        matching.discard(event.key)
                        self._write_event("DELETED", kind, event.obj)
                # As the watch cache does: a bookmark now and then, and one as the watch's
                # time runs out, so the client resumes from a recent revision.
                ending = time.monotonic() >= deadline
                if options.allow_bookmarks and (ending or time.monotonic() >= bookmark_due):
                    self._write_bookmark(kind, since, initial_events_end=False)
                    bookmark_due = time.monotonic() + self.api.bookmark_interval_s
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write_bookmark(
        self, kind: ResourceKind, revision: int, *, initial_events_end: bool
    ) -> None:
        obj = to_bookmark(kind, revision, initial_events_end=initial_events_end)
        if self._watch_table is not None:
            # a Table stream's bookmark is a Table: no rows, the revision in its list metadata
            obj = to_table(kind, [], resource_version=str(revision), include_object="")
        self._write_chunk({"type": "BOOKMARK", "object": obj})

    def _decode_body(self, raw: bytes) -> Any:
        """A created or replaced object: JSON, or protobuf for the kinds that can be read."""
        if is_protobuf(self.headers.get("Content-Type") or ""):
            return decode_object(raw)
        return _decode(raw)

    def _follow_log(self, route: Route, query: dict[str, str]) -> None:
        """pods/log?follow=true: the log so far, then what is written, until the container
        ends, the pod goes, or the client leaves."""
        registry = self.api.registry
        namespace, name = str(route.namespace), str(route.name)
        container = query.get("container")
        tail = query.get("tailLines")
        text = registry.read_log(namespace, name, container, int(tail) if tail else None)
        sent = len(registry.read_log(namespace, name, container, None))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._write_text_chunk(text)
            while not self.api.stopping:
                pod = registry.find(PODS, namespace, name)
                if pod is None:
                    break
                ended = _container_ended(pod, container)
                try:
                    full = registry.read_log(namespace, name, container, None)
                except ApiError:
                    break
                self._write_text_chunk(full[sent:])
                sent = len(full)
                if ended:
                    break
                time.sleep(_LOG_POLL_S)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write_text_chunk(self, text: str) -> None:
        if text:
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _write_event(self, event_type: str, kind: ResourceKind, obj: dict[str, Any]) -> None:
        if self._watch_table is not None:
            obj = _to_table(kind, [obj], self._watch_table)
        self._write_chunk({"type": event_type, "object": obj})

    def _write_chunk(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # ---------------------------------------------------------------- replies

    def _send(self, reply: Reply, headers: dict[str, str] | None = None) -> None:
        data, content_type = reply.to_bytes()
        self.send_response(reply.code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _selectors(query: dict[str, str]) -> tuple[LabelSelector, FieldSelector]:
    return (
        LabelSelector.from_text(query.get("labelSelector")),
        FieldSelector.from_text(query.get("fieldSelector")),
    )


def _container_ended(pod: dict[str, Any], container: str | None) -> bool:
    """Whether the followed container (the pod's only one when unnamed) has terminated."""
    if container is None:
        names = [c.get("name") for c in pod.get("spec", {}).get("containers") or []]
        container = names[0] if names else None
    return any(
        s.get("name") == container and "terminated" in (s.get("state") or {})
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _check_protobuf_readable(route: Route) -> None:
    """415 for a protobuf body of a kind the server cannot read from protobuf, as the real
    server answers for custom resources; every built-in kind served is read."""
    kind = route.kind
    if kind is not None and (route.subresource or can_decode(kind.api_version, kind.kind)):
        return
    raise ApiError.unsupported_media_type(MEDIA_TYPE, ["application/json", "application/yaml"])


def _to_table(
    kind: ResourceKind,
    objects: list[dict[str, Any]],
    query: dict[str, str],
    listed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return to_table(
        kind,
        objects,
        resource_version=(listed or {}).get("metadata", {}).get("resourceVersion", ""),
        include_object=query.get("includeObject", ""),
    )


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        raise ApiError.bad_request("the request body is empty")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise ApiError.bad_request(
            f"couldn't get version/kind; json parse error: {error}"
        ) from error


def _decode_yaml(raw: bytes) -> Any:
    """An apply patch: YAML (kubectl sends JSON, which YAML reads)."""
    if not raw.strip():
        raise ApiError.bad_request("the request body is empty")
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ApiError.bad_request(f"error decoding YAML: {error}") from error


def _require_create(method: str, name: str | None) -> None:
    """A review is only created (POSTed to its collection), never read or listed."""
    if method != "POST" or name is not None:
        raise ApiError.method_not_allowed()
