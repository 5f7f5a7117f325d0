"""What a list or watch request asks for, read from its query as kube-apiserver reads it:
where a watch starts, whether it begins with the current state (a streaming list,
`sendInitialEvents`), and the bookmarks it may be sent.

The validation is apimachinery's ValidateListOptions (meta/internalversion/validation), with
the WatchList feature on, as it is by default since 1.32. A streaming list ends its initial
events with a bookmark annotated `k8s.io/initial-events-end: "true"` only when the client
allows bookmarks, as the cacher does (its isListWatchRequest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver import fielderrors
from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.resources import ResourceKind

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
NOT_OLDER_THAN = "NotOlderThan"
EXACT = "Exact"
_TRUE = ("1", "true", "True")
_BOOLEANS = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True}
_BOOLEANS |= {"0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False}
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class WatchStart:
    """Where a watch begins: the revision its events follow, and whether it first sends the
    state at that revision as ADDED events (then, with `end_bookmark`, the bookmark that says
    the state is complete)."""

    revision: int
    initial_state: bool
    end_bookmark: bool


@dataclass(frozen=True)
class ListOptions:
    """The options of a list or watch request that decide what it returns."""

    watch: bool
    resource_version: str
    resource_version_match: str
    send_initial_events: bool | None
    allow_bookmarks: bool
    timeout_s: float

    @classmethod
    def from_query(cls, query: dict[str, str]) -> ListOptions:
        """The request's options, validated: 400 for a value that does not parse, 422 (as
        the real server's `ListOptions.meta.k8s.io "" is invalid`) for a forbidden mix."""
        send = query.get("sendInitialEvents")
        options = cls(
            watch=query.get("watch") in _TRUE,
            resource_version=query.get("resourceVersion", ""),
            resource_version_match=query.get("resourceVersionMatch", ""),
            send_initial_events=None if send is None else _parse_bool("sendInitialEvents", send),
            allow_bookmarks=_parse_bool(
                "allowWatchBookmarks", query.get("allowWatchBookmarks") or "false"
            ),
            timeout_s=float(query.get("timeoutSeconds") or DEFAULT_TIMEOUT_S),
        )
        rv = options.resource_version
        if rv not in ("", "0") and not rv.isdigit():
            raise ApiError.bad_request(f"invalid resource version: {rv}")
        causes = options._watch_problems() if options.watch else options._list_problems()
        if causes:
            raise ApiError.invalid("ListOptions", "meta.k8s.io", "", causes)
        return options

    def _list_problems(self) -> list[StatusCause]:
        causes: list[StatusCause] = []
        if match := self.resource_version_match:
            if not self.resource_version:
                causes.append(
                    fielderrors.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if match not in (EXACT, NOT_OLDER_THAN):
                causes.append(
                    fielderrors.not_supported(
                        "resourceVersionMatch", match, [EXACT, NOT_OLDER_THAN, ""]
                    )
                )
            if match == EXACT and self.resource_version == "0":
                causes.append(
                    fielderrors.forbidden(
                        "resourceVersionMatch",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        if self.send_initial_events is not None:
            causes.append(
                fielderrors.forbidden(
                    "sendInitialEvents", "sendInitialEvents is forbidden for list"
                )
            )
        return causes

    def _watch_problems(self) -> list[StatusCause]:
        causes: list[StatusCause] = []
        match = self.resource_version_match
        if self.send_initial_events is not None and match != NOT_OLDER_THAN:
            causes.append(
                fielderrors.forbidden(
                    "resourceVersionMatch",
                    f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}",
                )
            )
        if match:
            if self.send_initial_events is None:
                causes.append(
                    fielderrors.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                        "is provided",
                    )
                )
            if match != NOT_OLDER_THAN:
                causes.append(
                    fielderrors.not_supported("resourceVersionMatch", match, [NOT_OLDER_THAN])
                )
        return causes

    def start(self, current: int) -> WatchStart:
        """Where the watch starts, the store being at revision `current`.

        Without sendInitialEvents (the legacy watch): resourceVersion "" or "0" begins with
        the current state, N follows the changes after N. With sendInitialEvents=true the
        state is sent as of a revision not older than the one asked (the store is always at
        its newest); with false, "" and "0" follow the changes from now on."""
        rv = self.resource_version
        asked = int(rv) if rv not in ("", "0") else None
        if self.send_initial_events:
            if asked is not None and asked > current:
                raise ApiError.too_large_resource_version(asked, current)
            return WatchStart(current, initial_state=True, end_bookmark=self.allow_bookmarks)
        if asked is not None:
            return WatchStart(asked, initial_state=False, end_bookmark=False)
        legacy = self.send_initial_events is None
        return WatchStart(current, initial_state=legacy, end_bookmark=False)


def to_bookmark(kind: ResourceKind, revision: int, *, initial_events_end: bool) -> dict[str, Any]:
    """A BOOKMARK event's object: the kind, empty but for its resourceVersion (and, at the end
    of a streaming list's initial events, the annotation that says so)."""
    metadata: dict[str, Any] = {"resourceVersion": str(revision), "creationTimestamp": None}
    if initial_events_end:
        metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": metadata}


def _parse_bool(name: str, text: str) -> bool:
    """Go's strconv.ParseBool, as the query's conversion into ListOptions uses it."""
    value = _BOOLEANS.get(text)
    if value is None:
        raise ApiError.bad_request(
            f'strconv.ParseBool: parsing "{text}": invalid syntax for {name}'
        )
    return value
