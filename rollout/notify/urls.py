"""Where each webhook's URL is read from (an environment variable, a file, a Secret), and the
URL kept out of every message."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollout.spec.notify import NotifyEvent, UrlSource, Webhook

# (namespace, name) -> the Secret's data, decoded
SecretReader = Callable[[str, str], Mapping[str, str]]

# Where a Secret named without a namespace is read from a laptop (the schedule's default).
DEFAULT_SECRET_NAMESPACE = "rollout"
REDACTED = "<webhook URL>"
MAX_URL_CHARS = 4096


@dataclass(frozen=True)
class Receiver:
    """A webhook with its URL read: the URL is never shown (repr included)."""

    name: str
    url: str = field(repr=False)
    events: frozenset[NotifyEvent]


def read_url(
    source: UrlSource, read_secret: SecretReader, namespace: str, environ: Mapping[str, str]
) -> str:
    """The URL `source` names; ValueError saying where it was looked for, never what was found."""
    if source.env is not None:
        text = environ.get(source.env, "")
    elif source.file is not None:
        try:
            text = Path(source.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read {source.describe()}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{source.describe()} is not UTF-8 text") from None
    else:
        assert source.secret is not None
        where = source.secret.namespace or namespace
        try:
            data = read_secret(where, source.secret.name)
        except Exception as exc:  # any API failure: the webhook is skipped, the run goes on
            raise ValueError(
                f"cannot read {source.describe()} in namespace {where}: {type(exc).__name__}"
            ) from None
        text = data.get(source.secret.key, "")
    url = text.strip()
    if not url:
        raise ValueError(f"{source.describe()} is empty or unset")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or len(url) > MAX_URL_CHARS:
        raise ValueError(f"{source.describe()} does not hold an http(s) URL")
    return url


def resolve_receivers(
    webhooks: Iterable[Webhook],
    read_secret: SecretReader,
    namespace: str = DEFAULT_SECRET_NAMESPACE,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[Receiver], list[str]]:
    """The webhooks whose URL could be read, and a line for each that could not (that
    webhook is left out: a notification never fails a run)."""
    env = os.environ if environ is None else environ
    receivers, problems = [], []
    for hook in webhooks:
        try:
            url = read_url(hook.url_from, read_secret, namespace, env)
        except ValueError as exc:
            problems.append(f"notify {hook.name}: {exc}; not notified")
            continue
        receivers.append(Receiver(hook.name, url, frozenset(hook.events)))
    return receivers, problems


def redact(text: str, urls: Iterable[str]) -> str:
    """`text` without any of `urls`, nor their path or query (the part that is the secret)."""
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        secret_parts = [url, parts.path + ("?" + parts.query if parts.query else "")]
        secret_parts += [parts.path, parts.query, parts.password or ""]
        for part in sorted(secret_parts, key=len, reverse=True):
            if len(part) > 1:
                text = text.replace(part, REDACTED)
    return text
