"""Credentials a node already has, kept out of a saved plan and carried over at apply time.

A saved file's texts hold `<redacted>` where the node's files hold registry `auths` or a
hosts.toml `header` (rollout.secrets decides what is a secret). The plan keeps a digest of
each real text instead; at apply time the values are read from the node's own files (the
same files the fact digests just proved unchanged) and the filled text must hash to the
saved digest, so what is written is byte for byte what was planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from rollout.facts import NodeFacts
from rollout.plan import FileChange, NodePlan
from rollout.savedplan.digests import digest_text
from rollout.secrets import fill_secrets, redact_toml, secret_values


class CredentialsNotCarried(Exception):
    """A saved file's credentials could not be filled in from the node; the message says
    which file."""


def strip_file(change: FileChange) -> FileChange:
    """A planned file as a saved plan keeps it: every secret value `<redacted>`."""
    return dataclasses.replace(
        change,
        before=None if change.before is None else redact_toml(change.before),
        after=None if change.after is None else redact_toml(change.after),
    )


def file_digests(node: NodePlan) -> dict[str, dict[str, str | None]]:
    """Per planned file, the digests of its real texts (before, after)."""
    return {
        change.path: {
            "before": None if change.before is None else digest_text(change.before),
            "after": None if change.after is None else digest_text(change.after),
        }
        for change in node.files
    }


def carry_over(
    node: NodePlan, facts: NodeFacts, digests: Mapping[str, Mapping[str, str | None]]
) -> NodePlan:
    """The saved node's plan with the real file texts: each saved text with the node's
    credentials filled in, checked against its saved digest (a resumed node may hold the
    planned text already); CredentialsNotCarried when none matches."""
    files = facts.config_files.files
    carried: list[FileChange] = []
    for change in node.files:
        saved = digests.get(change.path, {})
        current = files.get(change.path)
        texts: list[str | None] = []
        for text, digest in (
            (change.before, saved.get("before")),
            (change.after, saved.get("after")),
        ):
            if text is None:
                texts.append(None)
            elif current is not None and digest_text(current) == digest:
                texts.append(current)  # the node holds it as planned
            else:
                texts.append(fill_from_node(text, current, files, digest))
                if texts[-1] is None:
                    raise CredentialsNotCarried(
                        f"{change.path}: the credentials the saved plan carries over are not "
                        "on the node as they were when the plan was saved"
                    )
        carried.append(dataclasses.replace(change, before=texts[0], after=texts[1]))
    return dataclasses.replace(node, files=tuple(carried))


def digest_or_none(text: str | None) -> str | None:
    return None if text is None else digest_text(text)


def fill_from_node(
    redacted: str, before: str | None, files: Mapping[str, str], digest: str | None
) -> str | None:
    """The saved text with secrets filled in from the node's files so that it hashes to
    `digest`; None when no reading of the node's values does."""
    if digest_text(redacted) == digest:
        return redacted  # no secret in it
    for values in value_sources(before, files):
        try:
            filled = fill_secrets(redacted, values)
        except KeyError:
            continue
        if digest_text(filled) == digest:
            return filled
    return None


def value_sources(
    before: str | None, files: Mapping[str, str]
) -> Iterator[Mapping[tuple[str, ...], str]]:
    """Where a file's credentials may come from: the file itself, then each of the node's
    files, then all of them merged (a drop-in that carries the main config's CRI table)."""
    if before is not None:
        yield secret_values(before)
    merged: dict[tuple[str, ...], str] = {}
    for text in files.values():
        values = secret_values(text)
        if values:
            yield values
        merged.update(values)
    yield merged
