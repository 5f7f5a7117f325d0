"""API errors and their wire form, the `Status` object the real server answers failures with."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout.errors import RolloutError


class StatusReason(StrEnum):
    """metav1.StatusReason values this server answers with, each with its one HTTP code."""

    code: int

    def __new__(cls, value: str, code: int) -> StatusReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.code = code
        return member

    BAD_REQUEST = ("BadRequest", 400)
    NOT_FOUND = ("NotFound", 404)
    ALREADY_EXISTS = ("AlreadyExists", 409)
    CONFLICT = ("Conflict", 409)
    INVALID = ("Invalid", 422)
    METHOD_NOT_ALLOWED = ("MethodNotAllowed", 405)
    UNSUPPORTED_MEDIA_TYPE = ("UnsupportedMediaType", 415)
    TOO_MANY_REQUESTS = ("TooManyRequests", 429)
    EXPIRED = ("Expired", 410)
    FORBIDDEN = ("Forbidden", 403)
    UNAUTHORIZED = ("Unauthorized", 401)
    INTERNAL_ERROR = ("InternalError", 500)
    SERVICE_UNAVAILABLE = ("ServiceUnavailable", 503)
    TIMEOUT = ("Timeout", 504)


@dataclass(frozen=True)
class StatusCause:
    """One metav1.StatusCause; `reason` is the cause type (the Go field is Type, JSON `reason`)."""

    reason: str
    message: str
    field: str | None = None

    def to_dict(self) -> dict[str, str]:
        cause = {"reason": self.reason, "message": self.message}
        if self.field is not None:
            cause["field"] = self.field
        return cause


@dataclass(frozen=True)
class GroupResource:
    """The resource an error is about, qualified as the real server spells it in messages."""

    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


class ApiError(RolloutError):
    """A request the emulated API server refuses; serialised as a Status by the HTTP layer."""

    def __init__(
        self,
        reason: StatusReason,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after_s: int = 0,
    ) -> None:
        self.code = reason.code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after_s = retry_after_s
        super().__init__(f"{self.code} {reason.value}: {message}")

    def to_status(self) -> dict[str, Any]:
        """The Status object, field for field as the real server writes it."""
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.value,
        }
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status

    @classmethod
    def about(
        cls, reason: StatusReason, resource: GroupResource, name: str, message: str
    ) -> ApiError:
        """An error about one named object: its details name the object as the server does."""
        return cls(reason, message, details=_details(resource, name))

    @classmethod
    def not_found(cls, resource: GroupResource, name: str) -> ApiError:
        message = f'{resource} "{name}" not found'
        return cls.about(StatusReason.NOT_FOUND, resource, name, message)

    @classmethod
    def forbidden(cls, resource: GroupResource, name: str, why: str) -> ApiError:
        """403 as admission plugins and the authorizer word it (apierrors.NewForbidden):
        empty detail fields are left out, as Go's omitempty does."""
        if not resource.resource:
            message = f"forbidden: {why}"
        elif name:
            message = f'{resource} "{name}" is forbidden: {why}'
        else:
            message = f"{resource} is forbidden: {why}"
        details = {key: value for key, value in _details(resource, name).items() if value}
        return cls(StatusReason.FORBIDDEN, message, details=details)

    @classmethod
    def unauthorized(cls) -> ApiError:
        """401 for a credential the server does not accept (the body says no more)."""
        return cls(StatusReason.UNAUTHORIZED, "Unauthorized")

    @classmethod
    def path_not_found(cls) -> ApiError:
        message = "the server could not find the requested resource"
        return cls(StatusReason.NOT_FOUND, message, details={})

    @classmethod
    def already_exists(cls, resource: GroupResource, name: str) -> ApiError:
        message = f'{resource} "{name}" already exists'
        return cls.about(StatusReason.ALREADY_EXISTS, resource, name, message)

    @classmethod
    def conflict(cls, resource: GroupResource, name: str, why: str) -> ApiError:
        message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
        return cls.about(StatusReason.CONFLICT, resource, name, message)

    @classmethod
    def stale(cls, resource: GroupResource, name: str) -> ApiError:
        """The optimistic-concurrency failure of an update with an old resourceVersion."""
        return cls.conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version "
            "and try again",
        )

    @classmethod
    def invalid(cls, kind: str, group: str, name: str, causes: list[StatusCause]) -> ApiError:
        qualified_kind = f"{kind}.{group}" if group else kind
        summary = ", ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
        if len(causes) > 1:
            summary = f"[{summary}]"
        details: dict[str, Any] = {"name": name}
        if group:
            details["group"] = group
        details["kind"] = kind
        details["causes"] = [c.to_dict() for c in causes]
        return cls(
            StatusReason.INVALID,
            f'{qualified_kind} "{name}" is invalid: {summary}',
            details=details,
        )

    @classmethod
    def unprocessable(cls, message: str) -> ApiError:
        """A 422 without field causes, as the server answers a JSON patch that cannot apply."""
        return cls(StatusReason.INVALID, message, details={})

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(StatusReason.BAD_REQUEST, message)

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        message = "the server does not allow this method on the requested resource"
        return cls(StatusReason.METHOD_NOT_ALLOWED, message, details={})

    @classmethod
    def unsupported_media_type(cls, content_type: str, accepted: list[str]) -> ApiError:
        return cls(
            StatusReason.UNSUPPORTED_MEDIA_TYPE,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(accepted)}",
            details={},
        )

    @classmethod
    def too_many_requests(
        cls, message: str, causes: list[StatusCause], retry_after_s: int = 0
    ) -> ApiError:
        details: dict[str, Any] = {"causes": [c.to_dict() for c in causes]}
        if retry_after_s:
            details["retryAfterSeconds"] = retry_after_s
        return cls(
            StatusReason.TOO_MANY_REQUESTS,
            message,
            details=details,
            retry_after_s=retry_after_s,
        )

    @classmethod
    def expired(cls, message: str) -> ApiError:
        return cls(StatusReason.EXPIRED, message)

    @classmethod
    def too_large_resource_version(cls, asked: int, current: int) -> ApiError:
        """A read or watch not older than a revision the server has not reached (storage's
        NewTooLargeResourceVersionError: a Timeout the client retries)."""
        return cls(
            StatusReason.TIMEOUT,
            f"Too large resource version: {asked}, current: {current}",
            details={
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
            retry_after_s=1,
        )

    @classmethod
    def internal(cls, message: str) -> ApiError:
        return cls(
            StatusReason.INTERNAL_ERROR,
            f"Internal error occurred: {message}",
            details={"causes": [{"message": message}]},
        )


def _details(resource: GroupResource, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.resource
    return details
