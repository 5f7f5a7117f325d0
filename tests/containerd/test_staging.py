"""Staging through the CommandRunner seam: the command protocol, import rewriting, cleanup."""

from __future__ import annotations

import io
import tarfile
import tomllib

import pytest

from rollout.commands import CommandFailed, CommandResult
from rollout.containerd import ConfigFiles, dump_config
from rollout.containerd.staging import normalise_dump, stage_text
from tests.fakes import ScriptedRunner

MAIN = "/etc/containerd/config.toml"
FILES = ConfigFiles(
    MAIN,
    {
        MAIN: '# main\nversion = 2\nimports = ["/etc/containerd/conf.d/*.toml", "extra.toml"]\n',
        "/etc/containerd/conf.d/a.toml": 'imports = ["/etc/containerd/extra.toml"]\n',
        "/etc/containerd/extra.toml": "",
    },
)


STAGE = "/tmp/rollout-containerd.abc123"


def node(dump_exit: int = 0) -> ScriptedRunner:
    """Answers like a node would: a fresh stage, then containerd's dump of the staged files."""
    dump = f'version = 2\nimports = ["{STAGE}/0/etc/a.toml"]\nroot = "{STAGE}/0/x"\n'
    return (
        ScriptedRunner(name="node-1")
        .on(["mktemp"], f"{STAGE}\n")
        .on(["tar"], "")
        .on(["sh"], CommandResult(("sh",), dump_exit, dump, "boom" if dump_exit else "", "node-1"))
        .on(["rm"], "")
    )


def test_protocol_and_cleanup() -> None:
    runner = node()
    dump = dump_config(runner, "/usr/bin/containerd", FILES)
    assert dump == {"version": 2, "root": "/x"}  # imports dropped, stage prefix removed
    kinds = [c[0] for c in runner.calls]
    assert kinds == ["mktemp", "tar", "sh", "rm"]
    stage = STAGE
    assert runner.calls[1] == ("tar", "-x", "-C", stage, "-f", "-")
    assert runner.calls[2][-3:] == (f"{stage}/0", "/usr/bin/containerd", f"{stage}/0{MAIN}")
    assert runner.calls[3] == ("rm", "-rf", "--", stage)
    with tarfile.open(fileobj=io.BytesIO(runner.inputs[1] or b"")) as tar:
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
    runner = node(dump_exit=1)
    with pytest.raises(CommandFailed, match="config dump"):
        dump_config(runner, "/usr/bin/containerd", FILES)
    assert runner.calls[-1][0] == "rm"


def test_stage_text_leaves_invalid_toml_to_containerd() -> None:
    assert stage_text("[broken\n", "/s") == "[broken\n"
    assert stage_text('imports = ["rel.toml"]\n', "/s") == 'imports = ["rel.toml"]\n'
    assert normalise_dump({"a": ["/s/x", "/y"]}, "/s") == {"a": ["/x", "/y"]}
