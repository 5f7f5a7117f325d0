"""Staging through the CommandRunner seam: the command protocol, import rewriting, cleanup."""

from __future__ import annotations

import io
import tarfile
import tomllib
from collections.abc import Sequence

import pytest

from rollout.commands import DEFAULT_TIMEOUT_S, CommandFailed, CommandResult
from rollout.containerd import ConfigFiles, dump_config
from rollout.containerd.staging import normalise_dump, stage_text

MAIN = "/etc/containerd/config.toml"
FILES = ConfigFiles(
    MAIN,
    {
        MAIN: '# main\nversion = 2\nimports = ["/etc/containerd/conf.d/*.toml", "extra.toml"]\n',
        "/etc/containerd/conf.d/a.toml": 'imports = ["/etc/containerd/extra.toml"]\n',
        "/etc/containerd/extra.toml": "",
    },
)


class ScriptedRunner:
    """A CommandRunner that records argv and answers like a node would."""

    def __init__(self, dump_exit: int = 0) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.tar: bytes = b""
        self.dump_exit = dump_exit

    @property
    def host(self) -> str:
        return "node-1"

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        out, code = "", 0
        if argv[0] == "mktemp":
            out = "/tmp/rollout-containerd.abc123\n"
        elif argv[0] == "tar":
            self.tar = stdin or b""
        elif argv[0] == "sh":
            code = self.dump_exit
            out = (
                'version = 2\nimports = ["/tmp/rollout-containerd.abc123/0/etc/a.toml"]\n'
                'root = "/tmp/rollout-containerd.abc123/0/x"\n'
            )
        return CommandResult(tuple(argv), code, out, "boom" if code else "", self.host)


def test_protocol_and_cleanup() -> None:
    runner = ScriptedRunner()
    dump = dump_config(runner, "/usr/bin/containerd", FILES)
    assert dump == {"version": 2, "root": "/x"}  # imports dropped, stage prefix removed
    kinds = [c[0] for c in runner.calls]
    assert kinds == ["mktemp", "tar", "sh", "rm"]
    stage = "/tmp/rollout-containerd.abc123"
    assert runner.calls[1] == ("tar", "-x", "-C", stage, "-f", "-")
    assert runner.calls[2][-3:] == (f"{stage}/0", "/usr/bin/containerd", f"{stage}/0{MAIN}")
    assert runner.calls[3] == ("rm", "-rf", "--", stage)
    with tarfile.open(fileobj=io.BytesIO(runner.tar)) as tar:
        names = tar.getnames()
        staged_main = tar.extractfile(f"0{MAIN}")
        assert staged_main is not None
        text = staged_main.read().decode()
    assert "0/etc/containerd/conf.d/a.toml" in names
    assert text.startswith("# main\n")  # only the imports value changes
    assert tomllib.loads(text)["imports"] == [
        f"{stage}/0/etc/containerd/conf.d/*.toml",
        "extra.toml",
    ]


def test_cleanup_when_the_dump_fails() -> None:
    runner = ScriptedRunner(dump_exit=1)
    with pytest.raises(CommandFailed, match="config dump"):
        dump_config(runner, "/usr/bin/containerd", FILES)
    assert runner.calls[-1][0] == "rm"


def test_stage_text_leaves_invalid_toml_to_containerd() -> None:
    assert stage_text("[broken\n", "/s") == "[broken\n"
    assert stage_text('imports = ["rel.toml"]\n', "/s") == 'imports = ["rel.toml"]\n'
    assert normalise_dump({"a": ["/s/x", "/y"]}, "/s") == {"a": ["/x", "/y"]}
