"""The emulated API server: a threading HTTP server over a registry, started and stopped."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from rollout.lab.apiserver.authentication import Authenticator
from rollout.lab.apiserver.faults import ApiFaultInjector
from rollout.lab.apiserver.handler import ApiRequestHandler, ApiServing
from rollout.lab.apiserver.registry import Registry

# How often a watch that allows bookmarks is sent one: the watch cache's bookmark frequency.
BOOKMARK_INTERVAL_S = 60.0


class ApiHttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its registry and its open connections."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: Registry,
        authenticator: Authenticator,
        bookmark_interval_s: float = BOOKMARK_INTERVAL_S,
    ) -> None:
        self.registry = registry
        self.authenticator = authenticator
        self.bookmark_interval_s = bookmark_interval_s
        self.stopping = False
        # the lab's fault hook (None: every request served as asked)
        self.faults: ApiFaultInjector | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, ApiRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Cut kept-alive and watching connections so their threads end."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class ApiServer:
    """The API server on host:port (port 0: an ephemeral port), serving from a thread."""

    def __init__(
        self,
        registry: Registry,
        host: str = "127.0.0.1",
        port: int = 0,
        authenticator: Authenticator | None = None,
        tls: ssl.SSLContext | None = None,
        bookmark_interval_s: float = BOOKMARK_INTERVAL_S,
    ) -> None:
        self.registry = registry
        self._http = ApiHttpServer(
            (host, port), registry, authenticator or Authenticator(), bookmark_interval_s
        )
        self._scheme = "http"
        if tls is not None:
            # kubectl sends credentials only over TLS; the handshake happens in the handler's
            # thread on its first read, not in the accept loop.
            self._http.socket = tls.wrap_socket(
                self._http.socket, server_side=True, do_handshake_on_connect=False
            )
            self._scheme = "https"
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            name="apiserver",
            kwargs={"poll_interval": 0.02},
            daemon=True,
        )

    @classmethod
    def start(
        cls,
        registry: Registry | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        authenticator: Authenticator | None = None,
        tls: ssl.SSLContext | None = None,
        bookmark_interval_s: float = BOOKMARK_INTERVAL_S,
    ) -> ApiServer:
        """Bind and serve (over TLS with a server context); returns once the socket accepts
        connections. Without an authenticator, credential-less requests act as the lab's
        administrator. A watch that allows bookmarks gets one every `bookmark_interval_s`."""
        server = cls(registry or Registry(), host, port, authenticator, tls, bookmark_interval_s)
        server._thread.start()
        return server

    def inject_faults(self, injector: ApiFaultInjector | None) -> None:
        """Fault requests as `injector` decides (None: serve every request as asked)."""
        self._http.faults = injector

    @property
    def host(self) -> str:
        return str(self._http.server_address[0])

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop accepting, end watches and idle connections, release the port."""
        self._http.stopping = True
        self.registry.close()
        self._http.shutdown()
        self._http.close_connections()
        self._http.server_close()
        self._thread.join(timeout=5)


# the handler reads the server through ApiServing: checked here, where both are known
_SERVES: type[ApiServing] = ApiHttpServer
