"""The one `config dump` command and its parser; the command checked against the real binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.containerd import StagingFailed, dump_command, parse_dump
from rollout.transports.local import LocalRunner
from tests.conftest import require
from tests.containerd.realdump import config_path_of, version_of

DROPIN = """version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "{path}"
"""


def test_parse_dump_reads_toml() -> None:
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = ""\n'
    assert parse_dump(text, "node-1") == {
        "version": 2,
        "plugins": {"io.containerd.grpc.v1.cri": {"registry": {"config_path": ""}}},
    }


def test_parse_dump_names_the_host_on_invalid_toml() -> None:
    with pytest.raises(StagingFailed, match=r"on node-7 printed invalid TOML") as caught:
        parse_dump("[plugins\nversion = 2\n", "node-7")
    assert caught.value.__cause__ is not None


def test_dump_command_runs_from_root_with_config() -> None:
    argv = dump_command("/usr/bin/containerd", "/etc/containerd/config.toml")
    assert argv[:2] == ["sh", "-c"]
    assert 'cd "$1"' in argv[2] and '--config "$3" config dump' in argv[2]
    assert argv[-3:] == ["/", "/usr/bin/containerd", "/etc/containerd/config.toml"]
    assert dump_command("c", "/s/etc/c.toml", workdir="/s")[-3] == "/s"


def test_dump_command_reads_what_the_daemon_reads_from_any_working_directory(
    containerd_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative glob: 1.6 resolves it against the working directory (/ under systemd), 1.7
    # and 2.1 against the importing file's directory.
    if Path("/conf.d").exists():
        require("this machine has a /conf.d, which a 1.6 relative glob would read")
    etc = tmp_path / "etc" / "containerd"
    (etc / "conf.d").mkdir(parents=True)
    main = etc / "config.toml"
    main.write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    (etc / "conf.d" / "10-registry.toml").write_text(DROPIN.format(path="/from/dropin"))
    # A decoy that only a dump run from this working directory would find on 1.6.
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-registry.toml").write_text(DROPIN.format(path="/from/cwd"))
    monkeypatch.chdir(tmp_path)
    runner = LocalRunner()

    result = runner.run(dump_command(str(containerd_bin), str(main)))
    assert result.ok, result.stderr
    loaded = config_path_of(parse_dump(result.stdout, runner.host))

    if version_of(containerd_bin).series == "1.6":
        assert loaded == ""  # the glob matched nothing under /: the drop-in is ignored
        # The setup is sensitive: the same binary run from here reads the decoy.
        naive = runner.run([str(containerd_bin), "--config", str(main), "config", "dump"])
        assert config_path_of(parse_dump(naive.stdout, "local")) == "/from/cwd"
    else:
        assert loaded == "/from/dropin"
