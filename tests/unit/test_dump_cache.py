"""The disk memo of `containerd config dump` results: never stale, safe between runs, bounded.

`rollout.memo.DiskMemo` keeps deterministic results by their inputs' content; the standard
`LocalContainerd` keeps each dump there keyed by the binary's digest, the files and the
code. A plan from a warm memo is the plan computed without one, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.containerd import localdump
from rollout.containerd.binaries import cache_dir
from rollout.containerd.errors import ConfigRejected
from rollout.containerd.files import ConfigFiles
from rollout.containerd.localdump import LocalContainerd, dump_store
from rollout.containerd.version import ContainerdVersion
from rollout.memo import DiskMemo
from tests.conftest import containerd_binary
from tests.examples import FACTS, PLAN

MAIN = "/etc/containerd/config.toml"
VERSION = ContainerdVersion.from_output(
    "containerd github.com/containerd/containerd 1.7.24 61f9fd88f79f081d64d6fa3bb1a0dc71ec870523"
)


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.json"))


# ---------------------------------------------------------------- DiskMemo


def test_a_value_is_computed_once_across_memos_of_one_directory(tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, object]:
        calls.append(1)
        return {"b": [1, 2.5, None, True], "a": {"x": "y"}}

    first = DiskMemo(tmp_path).get_or_compute(["k", 1], compute)
    again = DiskMemo(tmp_path).get_or_compute(["k", 1], compute)  # as a later run would
    assert again == first and list(again) == ["b", "a"]  # key order kept too
    assert calls == [1]
    assert DiskMemo(tmp_path).get_or_compute(["k", 2], compute) == first
    assert calls == [1, 1]  # another key is another entry


def test_errors_and_values_json_would_change_are_not_kept(tmp_path: Path) -> None:
    memo = DiskMemo(tmp_path)

    def fail() -> object:
        raise ValueError("bad input")

    for _ in range(2):
        with pytest.raises(ValueError):
            memo.get_or_compute("broken", fail)
    for value in ((1, 2), {"t": (1,)}, {1: "a"}, float("nan")):

        def same(kept: object = value) -> object:
            return kept

        assert memo.get_or_compute(["odd", repr(value)], same) is value
    assert entries(tmp_path) == []


def test_a_damaged_or_foreign_entry_is_a_miss_and_is_replaced(tmp_path: Path) -> None:
    memo = DiskMemo(tmp_path)
    memo.get_or_compute("k", lambda: "right")
    (entry,) = entries(tmp_path)
    for damage in (b"{not json", b'{"key": "\\"other\\"", "value": "wrong"}', b"[1]", b"{}"):
        entry.write_bytes(damage)
        assert DiskMemo(tmp_path).get_or_compute("k", lambda: "right") == "right"
        assert json.loads(entry.read_bytes())["value"] == "right"


def entry_of(root: Path, key: str) -> Path:
    (found,) = [p for p in entries(root) if json.loads(p.read_bytes())["key"] == json.dumps(key)]
    return found


def test_entries_stay_within_the_bound_least_recently_used_first(tmp_path: Path) -> None:
    memo = DiskMemo(tmp_path, max_bytes=3 * 1100)  # three entries of about 1,030 bytes
    for second, name in enumerate(("a", "b", "c"), start=1):
        memo.get_or_compute(name, lambda: "x" * 1000)
        os.utime(entry_of(tmp_path, name), ns=(second * 10**9, second * 10**9))
    assert memo.get_or_compute("a", lambda: "not computed") == "x" * 1000  # a hit, used now
    memo.get_or_compute("d", lambda: "x" * 1000)
    assert sum(p.stat().st_size for p in entries(tmp_path)) <= 3 * 1100
    kept = {json.loads(p.read_bytes())["key"] for p in entries(tmp_path)}
    assert kept == {json.dumps(k) for k in ("a", "c", "d")}  # b was the least recently used


def test_concurrent_runs_read_whole_entries(tmp_path: Path) -> None:
    """Threads and processes write and read the same keys at once: each gets its value."""
    value = {"big": ["v" * 200] * 500}
    script = (
        "import sys; from pathlib import Path; from rollout.memo import DiskMemo\n"
        "memo = DiskMemo(Path(sys.argv[1]), max_bytes=10**9)\n"
        "value = {'big': ['v' * 200] * 500}\n"
        "for i in range(60):\n"
        "    assert memo.get_or_compute(['k', i % 3], lambda: value) == value\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=Path.cwd())
        for _ in range(3)
    ]
    failures: list[BaseException] = []

    def read() -> None:
        try:
            for i in range(60):
                got = DiskMemo(tmp_path, max_bytes=10**9).get_or_compute(
                    ["k", i % 3], lambda: value
                )
                assert got == value
        except BaseException as exc:  # reported below, from the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.wait() for p in procs] == [0, 0, 0]
    assert failures == []
    assert len(entries(tmp_path)) == 3
    assert not list(tmp_path.glob(".entry-*"))  # no temporary file left behind


def test_a_file_digest_changes_when_the_file_is_rewritten(tmp_path: Path) -> None:
    binary = tmp_path / "bin"
    binary.write_bytes(b"one")
    memo = DiskMemo(tmp_path / "memo")
    first = memo.file_digest(str(binary))
    assert DiskMemo(tmp_path / "memo").file_digest(str(binary)) == first
    stat = binary.stat()
    binary.write_bytes(b"two")  # same size; the mtime set back: only the ctime tells
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert DiskMemo(tmp_path / "memo").file_digest(str(binary)) != first
    assert memo.file_digest(str(binary)) != first  # the memo in use sees it too


def test_the_setting_names_the_directory_or_turns_the_memo_off(tmp_path: Path) -> None:
    default = tmp_path / "default"
    assert DiskMemo.from_setting(None, lambda: default).root == default  # type: ignore[union-attr]
    assert DiskMemo.from_setting(" ", lambda: default).root == default  # type: ignore[union-attr]
    assert DiskMemo.from_setting("off", lambda: default) is None
    assert DiskMemo.from_setting("OFF", lambda: default) is None
    there = DiskMemo.from_setting(str(tmp_path / "x"), lambda: default)
    assert there is not None and there.root == tmp_path / "x"


def test_the_dump_store_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLOUT_DUMP_CACHE", raising=False)
    monkeypatch.setenv("ROLLOUT_CACHE", str(tmp_path))
    store = dump_store()
    assert store is not None and store.root == cache_dir() / "dumps"
    monkeypatch.setenv("ROLLOUT_DUMP_CACHE", "off")
    assert dump_store() is None


# ---------------------------------------------------------------- LocalContainerd


@pytest.fixture
def fake_containerd(tmp_path: Path) -> tuple[Path, Path]:
    """A containerd that prints its version, dumps a config as the file itself, and logs
    each run; a config holding `reject` makes it fail as containerd refusing it does."""
    binary = tmp_path / "containerd"
    log = tmp_path / "runs.log"
    binary.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$1" = --version ]; then\n'
        f'  echo "containerd github.com/containerd/containerd 1.7.24 abc"; exit 0\n'
        "fi\n"
        'if grep -q reject "$2"; then echo "failed to load: rejected" >&2; exit 1; fi\n'
        'cat "$2"\n'
    )
    binary.chmod(0o755)
    return binary, log


def runs(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def files(text: str) -> ConfigFiles:
    return ConfigFiles(main_path=MAIN, files={MAIN: text})


def test_a_later_run_reads_the_dump_and_label_instead_of_running_containerd(
    tmp_path: Path, fake_containerd: tuple[Path, Path]
) -> None:
    binary, log = fake_containerd
    memo = DiskMemo(tmp_path / "memo")

    def source() -> LocalContainerd:
        return LocalContainerd(locate=lambda _: binary, store=lambda: memo)

    config = files("version = 2\n[plugins.x]\n  a = 1\n")
    first = source().load(config, VERSION, {})
    assert len(runs(log)) == 2  # the dump and --version
    second = source().load(config, VERSION, {})
    assert second == first and len(runs(log)) == 2
    assert source().dumps_run == 0

    source().load(files("version = 2\n[plugins.x]\n  a = 2\n"), VERSION, {})
    assert len(runs(log)) == 3  # other files: a dump of their own

    binary.write_text(binary.read_text().replace("abc", "def"))  # another binary
    source().load(config, VERSION, {})
    assert len(runs(log)) == 5  # dumped and asked its version again


def test_a_rejected_config_is_not_kept(tmp_path: Path, fake_containerd: tuple[Path, Path]) -> None:
    binary, log = fake_containerd
    memo = DiskMemo(tmp_path / "memo")
    for expected in (1, 2):
        source = LocalContainerd(locate=lambda _: binary, store=lambda: memo)
        with pytest.raises(ConfigRejected, match="rejected"):
            source.load(files("reject = true\n"), VERSION, {})
        assert sum("config dump" in line for line in runs(log)) == expected


def test_files_holding_a_credential_are_never_kept(
    tmp_path: Path, fake_containerd: tuple[Path, Path]
) -> None:
    binary, log = fake_containerd
    memo = DiskMemo(tmp_path / "memo")
    secret = files(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.configs."r.example".auth]\n'
        '  password = "hunter2"\n'
    )
    for expected in (1, 2):
        LocalContainerd(locate=lambda _: binary, store=lambda: memo).load(secret, VERSION, {})
        assert sum("config dump" in line for line in runs(log)) == expected
    kept = b"".join(entry.read_bytes() for entry in entries(tmp_path / "memo"))
    assert b"hunter2" not in kept


def test_without_a_store_every_source_runs_its_dumps(
    fake_containerd: tuple[Path, Path],
) -> None:
    binary, log = fake_containerd
    for _ in range(2):
        LocalContainerd(locate=lambda _: binary, store=lambda: None).load(
            files("a = 1\n"), VERSION, {}
        )
    assert sum("config dump" in line for line in runs(log)) == 2


# ---------------------------------------------------------------- the plan


def plan_from(
    source: LocalContainerd,
    output: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """`rollout plan` of the examples with `source` as the standard defaults source."""
    monkeypatch.setattr(localdump, "_STANDARD", source)
    code = main(["plan", str(PLAN), "--facts", str(FACTS), "--output", output])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.mark.parametrize("output", ["text", "json"])
def test_the_examples_plan_the_same_from_a_cold_a_warm_and_no_memo(
    output: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for series in ("1.6", "1.7", "2.1"):
        containerd_binary(series)  # the real binaries, or skip (fail in CI)
    memo = tmp_path / "memo"
    reference = plan_from(LocalContainerd(store=lambda: None), output, monkeypatch, capsys)
    cold = LocalContainerd(store=lambda: DiskMemo(memo))
    assert plan_from(cold, output, monkeypatch, capsys) == reference
    assert cold.dumps_run > 0
    kept = entries(memo)
    warm = LocalContainerd(store=lambda: DiskMemo(memo))
    assert plan_from(warm, output, monkeypatch, capsys) == reference
    assert warm.dumps_run == 0  # every dump read from the memo
    assert entries(memo) == kept
