"""Run commands on this machine: for offline prediction with local containerd binaries and tests."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from rollout.commands import CommandResult, CommandTimeout
from rollout.transports.runner import ArgvRunner


class LocalRunner(ArgvRunner):
    """A CommandRunner for the local machine, with an optional fixed environment."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(env) if env is not None else None

    @property
    def host(self) -> str:
        return "local"

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        try:
            done = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout_s,
                env=self._env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(argv, self.host, timeout_s) from exc
        return CommandResult(
            argv=argv,
            exit_code=done.returncode,
            stdout=done.stdout.decode("utf-8", "replace"),
            stderr=done.stderr.decode("utf-8", "replace"),
            host=self.host,
        )
