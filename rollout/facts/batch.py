"""Several facts in one round trip: their commands run one after another in one `sh` on the
node, each framed so its stdout, stderr and exit code come back apart.

Every fact keeps its own command and its own parser (`read_fact`'s rule: a fact is read one
way), only the trip is shared: over SSH each command costs a channel open and an exchange,
so five facts cost five round trips where one does. Each command's argv is quoted with
`shlex.join`, as the transport quotes a single command; its stdin is /dev/null, so none of
them can eat the next one's output. The frame is a random boundary chosen per call, which
no command's output can know in advance.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from typing import Any

from rollout.commands import DEFAULT_TIMEOUT_S, CommandResult, CommandRunner
from rollout.fact import Fact, ProbeFailed, fact_output


def batch_script(facts: Sequence[Fact[Any]], boundary: str) -> str:
    """The `sh -c` script running each fact's command between frames on stdout and stderr."""
    lines = []
    for index, fact in enumerate(facts):
        lines.append(f"printf '%s\\n' '{boundary} {index}'")
        lines.append(f"printf '%s\\n' '{boundary} {index}' >&2")
        lines.append(f"{shlex.join(fact.command())} </dev/null")
        lines.append(f"printf '\\n%s %s\\n' '{boundary} {index}' \"$?\"")
        lines.append(f"printf '\\n%s\\n' '{boundary} {index}' >&2")
    return "\n".join(lines) + "\n"


def split_batch(
    facts: Sequence[Fact[Any]], boundary: str, result: CommandResult
) -> list[CommandResult]:
    """Each fact's own result out of the batch's framed output; ProbeFailed when cut short."""
    results = []
    for index, fact in enumerate(facts):
        mark = f"{boundary} {index}"
        try:
            out, code = _section(result.stdout, mark, with_code=True)
            err, _ = _section(result.stderr, mark, with_code=False)
        except ValueError:
            raise ProbeFailed(
                f"{result.host}: the batched probe stopped before `{shlex.join(fact.command())}`"
                f" (exit {result.exit_code}): {result.tail()}"
            ) from None
        results.append(CommandResult(tuple(fact.command()), code, out, err, result.host))
    return results


def _section(text: str, mark: str, *, with_code: bool) -> tuple[str, int]:
    start = text.index(mark + "\n") + len(mark) + 1
    end = text.index("\n" + mark + (" " if with_code else "\n"), start)
    code = 0
    if with_code:
        tail = end + len(mark) + 2
        code = int(text[tail : text.index("\n", tail)])
    return text[start:end], code


def read_facts(
    runner: CommandRunner, facts: Sequence[Fact[Any]], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Any]:
    """Read every fact in one round trip, each parsed as `read_fact` would parse it alone."""
    boundary = "rollout-fact-" + secrets.token_hex(12)
    argv = ["sh", "-c", batch_script(facts, boundary), "rollout-probe"]
    result = runner.run(argv, timeout_s=timeout_s)
    return [
        fact.parse(fact_output(fact, own), runner.host)
        for fact, own in zip(facts, split_batch(facts, boundary, result), strict=True)
    ]
