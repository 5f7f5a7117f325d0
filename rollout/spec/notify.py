"""policy.notify: webhooks told of a run's events; where each one's URL is read from.

A webhook's URL is a secret (a Slack incoming webhook's path is its credential), so a plan
never holds it: it names an environment variable, a file, or a Kubernetes Secret's key, read
when the run starts (rollout/notify/urls.py). A literal `url` is refused with that advice.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from rollout.inputs.fieldproblems import FieldProblem
from rollout.inputs.fieldtypes import DnsLabel, KubeName, SpecModel, Str

# A Secret's data key: letters, digits, '-', '_' and '.' (what Kubernetes accepts).
_SECRET_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class NotifyEvent(enum.Enum):
    """What a webhook can be told, in the order a run meets them."""

    RUN_STARTED = "run-started"
    WAVE_DONE = "wave-done"
    NODE_FAILED = "node-failed"
    NODE_LEFT_CORDONED = "node-left-cordoned"
    HALTED = "halted"
    WINDOW_CLOSED = "window-closed"
    PAUSED = "paused"
    RUN_DONE = "run-done"


def _check_secret_key(value: str) -> str:
    if not value or len(value) > 253 or not set(value) <= _SECRET_KEY_CHARS:
        raise FieldProblem(
            f"expected a Secret data key (letters, digits, '-', '_', '.'), found {value!r}"
        )
    return value


def _check_env_name(value: str) -> str:
    if (
        not value
        or not (value[0].isalpha() or value[0] == "_")
        or not all(c.isalnum() or c == "_" for c in value)
    ):
        raise FieldProblem(f"expected an environment variable name, found {value!r}")
    return value


class SecretRef(SpecModel):
    """A key of a Secret; its namespace defaults to the scheduled run's (or `rollout`)."""

    name: KubeName
    key: Annotated[Str, AfterValidator(_check_secret_key)]
    namespace: DnsLabel | None = None


class UrlSource(SpecModel):
    """Exactly one place the URL is read from."""

    env: Annotated[Str, AfterValidator(_check_env_name)] | None = None
    file: Annotated[Str, Field(min_length=1)] | None = None
    secret: SecretRef | None = None

    @model_validator(mode="after")
    def _check_one(self) -> UrlSource:
        given = [name for name in ("env", "file", "secret") if getattr(self, name) is not None]
        if len(given) != 1:
            raise FieldProblem(
                "url_from needs exactly one of env, file, secret"
                + (f" (found {', '.join(given)})" if given else ""),
                hint="e.g. url_from: {env: ROLLOUT_WEBHOOK_URL}",
            )
        return self

    def describe(self) -> str:
        """Where the URL comes from, for messages (never the URL itself)."""
        if self.env is not None:
            return f"environment variable {self.env}"
        if self.file is not None:
            return f"file {self.file}"
        assert self.secret is not None
        return f"Secret {self.secret.name} key {self.secret.key}"


def _check_events(value: tuple[NotifyEvent, ...]) -> tuple[NotifyEvent, ...]:
    for index, event in enumerate(value):
        if event in value[:index]:
            raise FieldProblem(f"event {event.value!r} is listed twice", at=(index,))
    return value


class Webhook(SpecModel):
    """One receiver: a name for the journal and messages, where its URL is, what it hears."""

    name: DnsLabel
    url_from: UrlSource
    events: Annotated[
        tuple[NotifyEvent, ...], Field(min_length=1), AfterValidator(_check_events)
    ] = tuple(NotifyEvent)

    @model_validator(mode="before")
    @classmethod
    def _refuse_literal_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and "url" in data:
            raise FieldProblem(
                "a webhook's URL is a secret and is never written in the plan",
                hint="name where to read it: url_from: {env: VAR}, {file: PATH} or"
                " {secret: {name: NAME, key: KEY}}",
                at=("url",),
            )
        return data

    def hears(self, event: NotifyEvent) -> bool:
        return event in self.events


def _check_names(value: tuple[Webhook, ...]) -> tuple[Webhook, ...]:
    for index, hook in enumerate(value):
        if any(other.name == hook.name for other in value[:index]):
            raise FieldProblem(f"webhook name {hook.name!r} is used twice", at=(index, "name"))
    return value


NotifyField = Annotated[tuple[Webhook, ...], AfterValidator(_check_names)]
