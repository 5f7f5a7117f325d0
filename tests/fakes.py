"""Test doubles shared by the suites: one scripted CommandRunner, and the API server's merge
patch of a node's labels or annotations for the fake Kubernetes clients."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rollout.commands import CommandResult, CommandRunner
from rollout.transports.runner import ArgvRunner

Reply = str | CommandResult | Callable[[Sequence[str]], CommandResult]


@dataclass(kw_only=True)
class ScriptedRunner(ArgvRunner):
    """A CommandRunner that records every command and replies by argv prefix.

    A list of replies is consumed in order (the last one repeats); a string reply is the
    stdout of a zero exit. A command no prefix matches goes to `inner` when there is one
    (a real runner underneath), and fails the test otherwise. Subclasses that break
    commands on purpose override `answer`.
    """

    name: str = "gpu-1"
    inner: CommandRunner | None = None
    replies: dict[tuple[str, ...], list[Reply]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    inputs: list[bytes | None] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.inner.host if self.inner is not None else self.name

    def on(self, prefix: Sequence[str], *replies: Reply) -> ScriptedRunner:
        self.replies[tuple(prefix)] = list(replies)
        return self

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        self.calls.append(argv)
        self.inputs.append(stdin)
        return self.answer(argv, stdin, timeout_s)

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        """The result of one recorded command: the scripted reply, else the inner runner's."""
        for prefix, queue in sorted(self.replies.items(), key=lambda kv: -len(kv[0])):
            if argv[: len(prefix)] == prefix:
                reply = queue.pop(0) if len(queue) > 1 else queue[0]
                if callable(reply):
                    return reply(argv)
                if isinstance(reply, CommandResult):
                    return reply
                return CommandResult(argv, 0, reply, "", self.host)
        if self.inner is None:
            raise AssertionError(f"unscripted command: {argv}")
        return self.inner.run(argv, stdin=stdin, timeout_s=timeout_s)

    def ran(self, *words: str) -> bool:
        return self.count(*words) > 0

    def count(self, *words: str) -> int:
        """How many recorded commands contain every one of `words` as an argument."""
        return sum(1 for call in self.calls if all(w in call for w in words))


def merge_patched(current: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """Labels or annotations after a merge patch, as the API server applies it: a None value
    removes its key, any other sets it."""
    merged = {**current, **patch}
    return {key: value for key, value in merged.items() if value is not None}
