"""Who is calling: bearer tokens (static ones, as kube-apiserver's token file, and
ServiceAccount tokens issued through TokenRequest), else the anonymous user.

The lab's own kubeconfig carries no credentials, so the lab's anonymous user is its
administrator (in `system:masters`); a server built with `anonymous=ANONYMOUS` treats
credential-less requests as a real server does. A token the server does not know is 401
either way."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.rbac import AUTHENTICATED_GROUP, MASTERS_GROUP, UserInfo
from rollout.lab.apiserver.resources import SERVICEACCOUNTS
from rollout.lab.apiserver.store import Store

LAB_ADMIN = UserInfo("lab-admin", (MASTERS_GROUP, AUTHENTICATED_GROUP))
_DEFAULT_TOKEN_LIFETIME_S = 3600
_MIN_TOKEN_LIFETIME_S = 600


@dataclass(frozen=True)
class _AccountToken:
    namespace: str
    name: str
    uid: str
    expires_at_s: float


class Authenticator:
    """Maps the Authorization header of a request to a user."""

    def __init__(
        self,
        tokens: Mapping[str, UserInfo] | None = None,
        *,
        anonymous: UserInfo = LAB_ADMIN,
    ) -> None:
        self._static = {
            token: UserInfo(user.name, (*user.groups, AUTHENTICATED_GROUP), user.uid)
            if AUTHENTICATED_GROUP not in user.groups
            else user
            for token, user in (tokens or {}).items()
        }
        self._anonymous = anonymous
        self._accounts: dict[str, _AccountToken] = {}
        self._lock = threading.Lock()

    def authenticate(self, authorization: str | None, store: Store) -> UserInfo:
        """The caller; 401 for a bearer token that is unknown, expired or whose account is gone."""
        if not authorization:
            return self._anonymous
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError.unauthorized()
        if token in self._static:
            return self._static[token]
        with self._lock:
            account = self._accounts.get(token)
        if account is None or account.expires_at_s < time.time():
            raise ApiError.unauthorized()
        found = store.get(SERVICEACCOUNTS, account.namespace, account.name)
        if found is None or found["metadata"].get("uid") != account.uid:
            raise ApiError.unauthorized()
        return UserInfo.from_service_account(account.namespace, account.name, account.uid)

    def request_token(self, account: Mapping[str, Any], body: Any) -> dict[str, Any]:
        """Answer a TokenRequest for a stored ServiceAccount (201): an opaque bearer token."""
        spec = (body or {}).get("spec") if isinstance(body, dict) else None
        spec = dict(spec or {})
        lifetime = int(spec.get("expirationSeconds") or _DEFAULT_TOKEN_LIFETIME_S)
        metadata = account["metadata"]
        if lifetime < _MIN_TOKEN_LIFETIME_S:
            why = f"Invalid value: {lifetime}: may not specify a duration less than 10 minutes"
            raise ApiError.invalid(
                "TokenRequest",
                "authentication.k8s.io",
                str(metadata["name"]),
                [StatusCause("FieldValueInvalid", why, "spec.expirationSeconds")],
            )
        token = f"lab-sa.{secrets.token_urlsafe(32)}"
        expires_at_s = time.time() + lifetime
        with self._lock:
            self._accounts[token] = _AccountToken(
                str(metadata["namespace"]),
                str(metadata["name"]),
                str(metadata["uid"]),
                expires_at_s,
            )
        spec["expirationSeconds"] = lifetime
        if not spec.get("audiences"):  # as the real server: none (or an empty list) asked
            spec["audiences"] = ["https://kubernetes.default.svc"]
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "creationTimestamp": None,
            },
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": format_timestamp(expires_at_s)},
        }
