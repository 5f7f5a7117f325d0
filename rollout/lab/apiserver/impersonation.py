"""Impersonation: `Impersonate-User`, `-Group` (repeated), `-Uid` and `-Extra-<key>` headers
(kubectl's `--as`, `--as-group`, `--as-uid`), as kube-apiserver's WithImpersonation filter
handles them between authentication and authorization: each thing asked for is authorized as
verb `impersonate` for the real caller (users, groups and serviceaccounts in the core group,
uids and userextras in authentication.k8s.io), then the request runs as the user asked for."""

from __future__ import annotations

from collections.abc import Callable
from email.message import Message
from urllib.parse import unquote

from rollout.lab.apiserver.errors import ApiError, StatusReason
from rollout.lab.apiserver.rbac import (
    AUTHENTICATED_GROUP,
    SERVICE_ACCOUNT_PREFIX,
    UNAUTHENTICATED_GROUP,
    RequestAttributes,
    UserInfo,
)

USER_HEADER = "Impersonate-User"
GROUP_HEADER = "Impersonate-Group"
UID_HEADER = "Impersonate-Uid"
EXTRA_PREFIX = "impersonate-extra-"
_AUTHENTICATION_GROUP = "authentication.k8s.io"
_ANONYMOUS_NAME = "system:anonymous"


def impersonate(
    headers: Message,
    caller: UserInfo,
    allowed: Callable[[RequestAttributes], bool],
    *,
    request_uri: str,
) -> UserInfo:
    """The user the request acts as: `caller`, or the one its headers ask for when the caller
    may impersonate each part of it (else 403, worded as the real server's)."""
    requested_user = headers.get(USER_HEADER) or ""
    groups_asked = headers.get_all(GROUP_HEADER) or []
    extras_asked = [
        (_unescape_extra_key(name.lower()[len(EXTRA_PREFIX) :]), value)
        for name, value in headers.items()
        if name.lower().startswith(EXTRA_PREFIX)
    ]
    uid = headers.get(UID_HEADER) or ""
    if not (requested_user or groups_asked or extras_asked or uid):
        return caller
    if not requested_user:
        # buildImpersonationRequests' error, answered by responsewriters.InternalError
        raise ApiError(
            StatusReason.INTERNAL_ERROR,
            f"Internal Server Error: {request_uri!r}: requested impersonation of groups, "
            "extras or a uid without impersonating a user",
        )
    asked: list[RequestAttributes] = []
    name = requested_user
    groups: list[str] = []
    account = _split_service_account(requested_user)
    if account is not None:
        namespace, account_name = account
        asked.append(_impersonate("serviceaccounts", account_name, namespace=namespace))
        if not groups_asked:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    else:
        asked.append(_impersonate("users", requested_user))
    for group in groups_asked:
        asked.append(_impersonate("groups", group))
        groups.append(group)
    extra: dict[str, list[str]] = {}
    for key, value in extras_asked:
        asked.append(
            _impersonate("userextras", value, api_group=_AUTHENTICATION_GROUP, subresource=key)
        )
        extra.setdefault(key, []).append(value)
    if uid:
        asked.append(_impersonate("uids", uid, api_group=_AUTHENTICATION_GROUP))
    for attributes in asked:
        if not allowed(attributes):
            raise attributes.forbidden(caller)
    if name != _ANONYMOUS_NAME:
        if not any(g in (AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP) for g in groups):
            groups.append(AUTHENTICATED_GROUP)
    elif UNAUTHENTICATED_GROUP not in groups:
        groups.append(UNAUTHENTICATED_GROUP)
    return UserInfo(
        name,
        tuple(groups),
        uid,
        extra=tuple((key, tuple(values)) for key, values in extra.items()),
    )


def _impersonate(
    resource: str,
    name: str,
    *,
    namespace: str = "",
    api_group: str = "",
    subresource: str = "",
) -> RequestAttributes:
    return RequestAttributes(
        verb="impersonate",
        api_group=api_group,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )


def _split_service_account(username: str) -> tuple[str, str] | None:
    """serviceaccount.SplitUsername: `system:serviceaccount:NS:NAME`, both parts non-empty."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, sep, name = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    if not sep or not namespace or not name or ":" in name:
        return None
    return namespace, name


def _unescape_extra_key(key: str) -> str:
    """Extra keys travel percent-encoded in header names (kubectl escapes them)."""
    return unquote(key)
