"""The node-side steps' decisions from recorded outputs: systemctl parsing, restart proof,
drift and no-op decisions; and the node file scripts run for real on this machine."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from rollout.changes.containerd.steps import (
    ContainerdVerify,
    ContainerdWrite,
    classify_files,
    describe_drift,
    remove_run_stages,
    with_planned_before,
)
from rollout.changes.containerd.writes import build_intent
from rollout.commands import CommandFailed, CommandResult
from rollout.containerd import ConfigFiles, StagingFailed, parse_version
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.containerd.staging import remove_stages, stage_template
from rollout.fact import read_fact
from rollout.facts import (
    ConfigFilesFact,
    NodeFacts,
    ServiceFact,
    ServiceProbeFailed,
    parse_service_show,
    parse_systemd_timestamp,
)
from rollout.plan import FileChange, NodePlan
from rollout.retry import RetryPolicy, call_with_policy
from rollout.run import Journal
from rollout.spec import load_spec
from rollout.steps import builtin_steps
from rollout.steps.backup import (
    BackupRecord,
    NodeFileError,
    back_up_file,
    backup_path_for,
    parse_node_files,
    parse_sha256sum,
    read_node_files,
    replace_file,
    restore_file,
)
from rollout.steps.base import StepContext, StepFailed, StepResultKind
from rollout.steps.preflight import Preflight
from rollout.steps.systemd import RestartFailed, SystemdRestart, restart_service
from rollout.transports.errors import SshConnectError
from rollout.transports.kube import KubeClient
from rollout.transports.local import LocalRunner
from tests.conftest import require
from tests.examples import PLAN
from tests.fakes import Reply, ScriptedRunner

MAIN = "/etc/containerd/config.toml"
HOSTS = "/etc/containerd/certs.d/docker.io/hosts.toml"

# `systemctl show containerd --timestamp=us+utc -p ...` on a lab node (systemd 252)
SHOW_RUNNING = """MainPID=37
NRestarts=0
ActiveState=active
SubState=running
ActiveEnterTimestamp=Sun 2026-11-29 23:38:01.558249 UTC
InvocationID=48f11d1588c7435584c1293daf6fcae9
"""


def show(pid: int, active: str = "active", sub: str = "running", at: str = "") -> str:
    stamp = at or "Sun 2026-11-29 23:40:00.000001 UTC"
    return (
        f"MainPID={pid}\nNRestarts=0\nActiveState={active}\nSubState={sub}\n"
        f"ActiveEnterTimestamp={stamp}\nInvocationID=x\n"
    )


# --- a scripted runner ---------------------------------------------------------------------


def failed(code: int = 1, stderr: str = "") -> CommandResult:
    return CommandResult(("x",), code, "", stderr, "gpu-1")


# --- systemctl show --------------------------------------------------------------------------


def test_show_parser_reads_a_running_service() -> None:
    state = parse_service_show(SHOW_RUNNING)
    assert state.main_pid == 37 and state.running and state.n_restarts == 0
    assert state.active_enter_at == datetime(2026, 11, 29, 23, 38, 1, 558249, tzinfo=UTC)
    assert state.invocation_id == "48f11d1588c7435584c1293daf6fcae9"


@pytest.mark.parametrize(
    ("text", "running"),
    [
        ("MainPID=0\nActiveState=activating\nSubState=auto-restart\nNRestarts=3\n", False),
        ("MainPID=0\nActiveState=failed\nSubState=failed\nActiveEnterTimestamp=\n", False),
        ("MainPID=0\nActiveState=active\nSubState=exited\n", False),
        ("ActiveState=active\nMainPID=9\nSubState=running\n", True),
    ],
)
def test_show_parser_states(text: str, running: bool) -> None:
    assert parse_service_show(text).running is running


def test_show_parser_refuses_output_without_the_properties() -> None:
    with pytest.raises(ServiceProbeFailed, match="MainPID, ActiveState, SubState"):
        parse_service_show("Unit containerd.service could not be found.\n")
    with pytest.raises(ServiceProbeFailed, match="not a number"):
        parse_service_show("MainPID=x\nActiveState=active\nSubState=running\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Sun 2026-11-29 23:38:01.558249 UTC", datetime(2026, 11, 29, 23, 38, 1, 558249, UTC)),
        ("Sun 2026-11-29 23:38:01 UTC", datetime(2026, 11, 29, 23, 38, 1, tzinfo=UTC)),
        ("", None),
        ("n/a", None),
    ],
)
def test_systemd_timestamps(text: str, expected: datetime | None) -> None:
    assert parse_systemd_timestamp(text) == expected


def test_systemd_timestamp_in_a_local_zone_is_refused() -> None:
    # the probe asks for UTC; a local-zone stamp means an old systemd: refuse, do not guess
    with pytest.raises(ServiceProbeFailed, match="cannot read"):
        parse_systemd_timestamp("Sun 2026-11-29 23:38:01 CET")


def test_show_probe_asks_for_every_property_in_utc() -> None:
    argv = ServiceFact().command()
    assert argv[:4] == ["systemctl", "show", "containerd", "--timestamp=us+utc"]
    for name in ("MainPID", "ActiveState", "SubState", "NRestarts", "ActiveEnterTimestamp"):
        assert name in argv


# --- restart proof ---------------------------------------------------------------------------


def test_restart_is_proven_by_a_new_main_pid() -> None:
    runner = (
        ScriptedRunner()
        .on(["systemctl", "show"], show(37), show(0, "activating", "start"), show(88))
        .on(["systemctl", "restart"], "")
    )
    sleeps: list[float] = []
    proof = restart_service(runner, 10, sleep=sleeps.append)
    assert (proof.before.main_pid, proof.after.main_pid) == (37, 88)
    assert any("activating/start" in s for s in proof.seen)
    assert sleeps == [1.0]
    # invariant 3: through systemd, never a signal
    assert not runner.ran("kill") and runner.ran("systemctl", "restart", "containerd")


def test_restart_that_never_comes_back_names_states_and_journal() -> None:
    runner = (
        ScriptedRunner()
        .on(["systemctl", "show"], show(37), show(0, "activating", "auto-restart"))
        .on(["systemctl", "restart"], "")
        .on(["journalctl"], "Nov 29 containerd[88]: failed to load config\n")
    )
    with pytest.raises(RestartFailed) as raised:
        restart_service(runner, 3, sleep=lambda _: None)
    message = str(raised.value)
    assert "within 3s" in message and "activating/auto-restart" in message
    assert "failed to load config" in message and "active/running MainPID=37" in message
    assert runner.ran("journalctl", "-u", "containerd", "-n", "20", "--no-pager")


def test_restart_with_the_same_main_pid_is_not_proven() -> None:
    runner = ScriptedRunner().on(["systemctl", "show"], show(37)).on(["systemctl", "restart"], "")
    runner.on(["journalctl"], "")
    with pytest.raises(RestartFailed, match="new MainPID"):
        restart_service(runner, 2, sleep=lambda _: None)


def test_a_failed_restart_job_fails_at_once() -> None:
    runner = (
        ScriptedRunner()
        .on(["systemctl", "show"], show(37), show(0, "activating", "auto-restart"))
        .on(["systemctl", "restart"], failed(1, "Job for containerd.service failed."))
        .on(["journalctl"], "ExecStartPre=/bin/false (code=exited, status=1/FAILURE)")
    )
    with pytest.raises(RestartFailed, match=r"Job for containerd\.service failed") as raised:
        restart_service(runner, 30, sleep=lambda _: pytest.fail("no waiting after a failed job"))
    assert "status=1/FAILURE" in str(raised.value)


# --- pure decisions --------------------------------------------------------------------------

PLANNED = (
    FileChange(MAIN, "version = 2\n", 'version = 2\n[x]\ny = "z"\n', "intent"),
    FileChange(HOSTS, None, 'server = "https://registry-1.docker.io"\n', "mirrors"),
)


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        ({MAIN: "version = 2\n", HOSTS: None}, ([MAIN, HOSTS], [], [])),
        ({MAIN: PLANNED[0].after, HOSTS: PLANNED[1].after}, ([], [MAIN, HOSTS], [])),
        ({MAIN: PLANNED[0].after, HOSTS: None}, ([HOSTS], [MAIN], [])),
        ({MAIN: "version = 2\n# edited\n", HOSTS: None}, ([HOSTS], [], [MAIN])),
        ({MAIN: "version = 2\n", HOSTS: "other\n"}, ([MAIN], [], [HOSTS])),
        ({MAIN: None, HOSTS: None}, ([HOSTS], [], [MAIN])),
    ],
    ids=["original", "written", "partly-written", "edited", "created-by-someone", "removed"],
)
def test_drift_and_noop_decisions(
    current: dict[str, str | None], expected: tuple[list[str], list[str], list[str]]
) -> None:
    split = classify_files(PLANNED, current)
    assert tuple([f.path for f in part] for part in split) == expected


def test_drift_message_shows_the_edit() -> None:
    text = describe_drift(PLANNED[0], "version = 2\n# edited\n")
    assert text.startswith(f"{MAIN} differs from what the plan read")
    assert "+# edited" in text
    assert "was removed" in describe_drift(PLANNED[0], None)
    assert "was created" in describe_drift(PLANNED[1], "x")


def test_planned_before_undoes_a_partial_write() -> None:
    files = ConfigFiles(MAIN, {MAIN: PLANNED[0].after or "", HOSTS: PLANNED[1].after or ""})
    assert dict(with_planned_before(files, PLANNED).files) == {MAIN: "version = 2\n"}


def test_runtime_handlers_of_both_config_versions() -> None:
    v2 = {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "containerd": {"runtimes": {"runc": {}, "nvidia": {}, "nvidia-cdi": {}}}
            }
        },
    }
    v3 = {
        "version": 3,
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {"runtimes": {"runc": {}, "nvidia": {}}}
            },
            "io.containerd.cri.v1.images": {"registry": {"config_path": ""}},
        },
    }
    assert list_runtime_handlers(v2) == ("nvidia", "nvidia-cdi", "runc")
    assert list_runtime_handlers(v3) == ("nvidia", "runc")
    assert list_runtime_handlers({}) == ()


def test_intent_of_the_registry_example() -> None:
    intent = build_intent(load_spec(PLAN))
    assert intent is not None
    assert [(s.key, s.value) for s in intent.settings] == [
        ("registry.config_path", "/etc/containerd/certs.d")
    ]


def test_node_file_listing_parser() -> None:
    assert parse_node_files("/a\x001\x00x = 1\n\x00/b\x000\x00\x00") == {
        "/a": "x = 1\n",
        "/b": None,
    }
    assert parse_node_files("") == {}
    with pytest.raises(NodeFileError, match="ends inside a record"):
        parse_node_files("/a\x001\x00")
    with pytest.raises(NodeFileError, match="bad existence flag"):
        parse_node_files("/a\x002\x00\x00")


def test_backup_paths_mirror_the_node_tree() -> None:
    assert (
        backup_path_for("run-1", MAIN)
        == "/var/lib/rollout/backups/run-1/etc/containerd/config.toml"
    )
    with pytest.raises(NodeFileError):
        backup_path_for("../x", MAIN)
    digest = "a" * 64
    assert parse_sha256sum(f"{digest}  /etc/x y\nsha256sum: /z: No such file\n") == {
        "/etc/x y": digest
    }


def test_every_node_step_is_registered() -> None:
    steps = builtin_steps()
    assert isinstance(steps["containerd.write"], ContainerdWrite)
    assert isinstance(steps["containerd.verify"], ContainerdVerify)
    assert isinstance(steps["systemd.restart"], SystemdRestart)


# --- steps with a scripted node ------------------------------------------------------------


def make_context(tmp_path: Path, runner: ScriptedRunner) -> StepContext:
    version = parse_version("containerd github.com/containerd/containerd v1.7.24 abc\n")
    facts = NodeFacts("gpu-1", version, ConfigFiles(MAIN, {MAIN: "version = 2\n"}))
    plan = NodePlan(name="gpu-1", containerd_version=str(version), steps=(), files=PLANNED)
    journal = Journal.create(tmp_path, "test", "{}")
    return StepContext(
        node="gpu-1",
        node_plan=plan,
        facts=facts,
        spec=load_spec(PLAN),
        runner=runner,
        kube=cast(KubeClient, None),  # the node steps never use the API
        journal=journal,
        progress=lambda _: None,
        sleep=lambda _: None,
    )


def listing(files: dict[str, str | None]) -> str:
    """What the write step's one read of the node's files prints (ConfigFilesFact with the
    planned files): `path NUL content NUL` per file found, absent ones left out."""
    return "".join(f"{p}\0{t}\0" for p, t in files.items() if t is not None)


def test_the_files_fact_reads_the_planned_files_too(tmp_path: Path) -> None:
    """The write step's one read (ConfigFilesFact with `also`), in a real shell: the
    directory as the facts read it, plus each planned file wherever it
    lies (through a link, whatever its size); absent planned files are left out, and a
    planned path that is a directory is an error, not an absent file to write over."""
    etc, elsewhere = tmp_path / "containerd", tmp_path / "certs.d"
    (etc / "conf.d").mkdir(parents=True)
    elsewhere.mkdir()
    (etc / "config.toml").write_text("version = 2\n")
    (etc / "conf.d" / "99-nvidia.toml").write_text("# toolkit\n")
    (elsewhere / "hosts.toml").write_text('server = "x"\n')
    (etc / "conf.d" / "link.toml").symlink_to(elsewhere / "hosts.toml")
    (etc / "big.toml").write_text("#" * 1_000_001)
    main = str(etc / "config.toml")

    def planned(*paths: Path) -> list[FileChange]:
        return [FileChange(str(p), None, "x = 1\n", "test") for p in paths]

    def read(*paths: Path) -> dict[str, str]:
        also = tuple(f.path for f in planned(*paths))
        fact = ConfigFilesFact(main, directory=str(etc), also=also)
        return dict(read_fact(LocalRunner(), fact).files)

    found = read(elsewhere / "hosts.toml", tmp_path / "absent.toml", etc / "conf.d" / "link.toml")
    assert found == {
        main: "version = 2\n",
        str(etc / "conf.d" / "99-nvidia.toml"): "# toolkit\n",
        str(elsewhere / "hosts.toml"): 'server = "x"\n',
        str(etc / "conf.d" / "link.toml"): 'server = "x"\n',
    }
    assert len(read(etc / "big.toml")[str(etc / "big.toml")]) == 1_000_001
    with pytest.raises(CommandFailed, match="is not a regular file"):
        read(elsewhere)


def test_write_fails_on_drift_before_touching_anything(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(
        ["sh", "-c"], listing({MAIN: "version = 2\n# edited\n", HOSTS: None})
    )
    ctx = make_context(tmp_path, runner)
    with pytest.raises(StepFailed, match="node changed since the plan") as raised:
        ContainerdWrite().apply(ctx)
    assert str(raised.value).startswith("gpu-1: containerd.write: ")
    assert MAIN in str(raised.value)
    assert len(runner.calls) == 1  # the read; no prediction, backup or write
    assert ctx.load_data("containerd.write") == {}


def test_write_is_a_noop_when_already_written(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(
        ["sh", "-c"], listing({MAIN: PLANNED[0].after, HOSTS: PLANNED[1].after})
    )
    ctx = make_context(tmp_path, runner)
    ctx.save_data("containerd.write", {"after_dump": {"version": 2}})
    result = ContainerdWrite().apply(ctx)
    assert result.kind is StepResultKind.NOOP and "already written" in result.detail
    assert len(runner.calls) == 1


def test_write_refuses_files_it_finds_written_without_a_backup(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(["sh", "-c"], listing({MAIN: PLANNED[0].after, HOSTS: None}))
    ctx = make_context(tmp_path, runner)
    with pytest.raises(StepFailed, match="recorded no backup"):
        ContainerdWrite().apply(ctx)


def test_restart_is_a_noop_after_a_restart_that_followed_the_write(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(
        ["systemctl", "show"], show(88, at="Sun 2026-11-29 23:40:00.000001 UTC")
    )
    ctx = make_context(tmp_path, runner)
    ctx.save_data("containerd.write", {"written_at": "2026-11-29T23:39:59.900000+00:00"})
    result = SystemdRestart().apply(ctx)
    assert result.kind is StepResultKind.NOOP and "already restarted" in result.detail
    assert not runner.ran("restart")


def test_restart_runs_when_the_process_predates_the_write(tmp_path: Path) -> None:
    runner = (
        ScriptedRunner()
        .on(["systemctl", "show"], *[show(37, at="Sun 2026-11-29 23:38:01 UTC")] * 2, show(88))
        .on(["systemctl", "restart"], "")
    )
    ctx = make_context(tmp_path, runner)
    ctx.save_data("containerd.write", {"written_at": "2026-11-29T23:39:00+00:00"})
    result = SystemdRestart().apply(ctx)
    assert result.kind is StepResultKind.DONE and "MainPID 37 -> 88" in result.detail
    assert runner.count("systemctl", "restart") == 1


def test_verify_needs_the_write_prediction(tmp_path: Path) -> None:
    ctx = make_context(tmp_path, ScriptedRunner())
    with pytest.raises(StepFailed, match="saved no predicted config"):
        ContainerdVerify().apply(ctx)


RUNC_ONLY_DUMP = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'


def verify_runner(*dumps: Reply) -> ScriptedRunner:
    """containerd running as PID 88, and what `config dump` answers, in turn."""
    return ScriptedRunner().on(["systemctl", "show"], show(88)).on(["sh", "-c"], *dumps)


def test_verify_names_missing_handlers(tmp_path: Path) -> None:
    ctx = make_context(tmp_path, verify_runner(RUNC_ONLY_DUMP))
    expected = {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "containerd": {"runtimes": {"runc": {}, "nvidia": {}, "nvidia-cdi": {}}}
            }
        },
    }
    ctx.save_data(
        "containerd.write",
        {
            "after_dump": expected,
            "handlers_before": ["nvidia", "nvidia-cdi", "runc"],
            "written_at": "2026-11-29T23:39:00+00:00",
        },
    )
    with pytest.raises(StepFailed) as raised:
        ContainerdVerify().apply(ctx)
    message = str(raised.value)
    assert "present before are gone: nvidia, nvidia-cdi" in message
    assert "differs from the prediction" in message


def test_verify_refuses_a_process_older_than_the_write(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(["systemctl", "show"], show(37, at="Sun 2026-11-29 23:38:01 UTC"))
    ctx = make_context(tmp_path, runner)
    ctx.save_data(
        "containerd.write",
        {"after_dump": {"version": 2}, "written_at": "2026-11-29T23:39:00+00:00"},
    )
    with pytest.raises(StepFailed, match="did not start after the files were written"):
        ContainerdVerify().apply(ctx)


# --- the node file scripts, run for real here ----------------------------------------------


def test_backup_replace_restore_round_trip(tmp_path: Path) -> None:
    runner = LocalRunner()
    target = tmp_path / "etc" / "config.toml"
    target.parent.mkdir()
    original = b"version = 2\n\xff not utf-8 \xfe\n"
    target.write_bytes(original)
    target.chmod(0o600)
    backup = str(tmp_path / "backups" / "run" / "config.toml")

    record = back_up_file(runner, str(target), backup)
    assert record.sha256 == hashlib.sha256(original).hexdigest()
    assert Path(backup).read_bytes() == original

    replace_file(runner, str(target), 'version = 2\nx = "é"\n')
    assert target.read_text() == 'version = 2\nx = "é"\n'
    assert target.stat().st_mode & 0o777 == 0o600  # mode of the original kept
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".rollout.")]
    assert read_node_files(runner, [str(target), str(tmp_path / "none")]) == {
        str(target): 'version = 2\nx = "é"\n',
        str(tmp_path / "none"): None,
    }

    restore_file(runner, record)
    assert target.read_bytes() == original and target.stat().st_mode & 0o777 == 0o600
    with pytest.raises(NodeFileError, match="the backup is damaged"):
        restore_file(runner, BackupRecord(record.path, record.backup_path, "0" * 64))


def test_replace_creates_a_new_file_and_its_directories(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        require("new files are chowned to root: run as root")
    target = tmp_path / "certs.d" / "docker.io" / "hosts.toml"
    replace_file(LocalRunner(), str(target), 'server = "x"\n')
    assert target.read_text() == 'server = "x"\n'
    assert target.stat().st_mode & 0o777 == 0o644 and target.stat().st_uid == 0


class CutShortRunner(LocalRunner):
    """A transfer cut short: the remote side sees only the first half of stdin, then its
    end, as when rollout is killed while sending a file (ssh closes the channel)."""

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        return super().run_argv(argv, stdin[: len(stdin) // 2] if stdin else stdin, timeout_s)


@pytest.mark.parametrize("before", [b"version = 2\n# the original\n", None])
def test_a_write_cut_short_replaces_nothing(tmp_path: Path, before: bytes | None) -> None:
    """The CI run that found it: an apply killed mid-write left the target empty (the
    script's `cat` took the early end of input as the whole file and moved it in place), and
    the resume refused the node as drifted."""
    target = tmp_path / "conf.d" / "99-nvidia.toml"
    target.parent.mkdir()
    if before is not None:
        target.write_bytes(before)
    with pytest.raises(CommandFailed, match="arrived incomplete, nothing replaced"):
        replace_file(CutShortRunner(), str(target), "version = 2\n" + "x = 1\n" * 100)
    assert (target.read_bytes() if target.exists() else None) == before
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".rollout.")]


# --- transient errors reach the retry policy ----------------------------------------------


WRITTEN_AT = "2026-11-29T23:39:00+00:00"


def dropped(argv: Sequence[str]) -> CommandResult:
    raise SshConnectError("gpu-1", "10.0.0.1:22", f"connection lost while running {argv[0]}")


def test_a_dropped_connection_reaches_the_retry_policy_from_every_node_step(
    tmp_path: Path,
) -> None:
    """Each node step lets a transient error through (not a permanent StepFailed)."""
    runner = ScriptedRunner().on(["sh", "-c"], dropped).on(["systemctl", "show"], dropped)
    ctx = make_context(tmp_path, runner)
    with pytest.raises(SshConnectError):
        ContainerdWrite().apply(ctx)
    ctx.save_data("containerd.write", {"after_dump": {"version": 2}})
    with pytest.raises(SshConnectError):
        SystemdRestart().apply(ctx)
    with pytest.raises(SshConnectError):
        ContainerdVerify().apply(ctx)
    with pytest.raises(SshConnectError):
        ContainerdWrite().undo(ctx)


def test_verify_succeeds_when_the_retry_policy_tries_again(tmp_path: Path) -> None:
    runner = verify_runner(dropped, RUNC_ONLY_DUMP)
    ctx = make_context(tmp_path, runner)
    runtimes = {"containerd": {"runtimes": {"runc": {}}}}
    expected = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": runtimes}}
    saved = {"after_dump": expected, "handlers_before": ["runc"], "written_at": WRITTEN_AT}
    ctx.save_data("containerd.write", saved)
    policy = RetryPolicy(attempts=3, first_wait_s=0)
    result = call_with_policy(lambda: ContainerdVerify().apply(ctx), policy, sleep=lambda _: None)
    assert result.kind is StepResultKind.DONE
    assert sum(1 for call in runner.calls if "rollout-dump" in call) == 2


@pytest.mark.parametrize(
    "written_at",
    ["2026-11-29T23:39:00+00:00", None],
    ids=["after-the-write", "no-write-time"],
)
@pytest.mark.parametrize(
    "retry_sees",
    [
        # the retry finds the new process running
        [show(88, at="Sun 2026-11-29 23:40:00 UTC")],
        # the retry comes while systemd's restart job still runs: the old process gone, the
        # new one not yet up (a session cut during `systemctl restart` on a slow node)
        [
            show(0, active="deactivating", sub="stop-sigterm"),
            show(0, active="activating", sub="start"),
            show(88, at="Sun 2026-11-29 23:40:00 UTC"),
        ],
    ],
    ids=["restarted", "still-restarting"],
)
def test_a_restart_whose_answer_was_lost_is_not_repeated(
    tmp_path: Path, written_at: str | None, retry_sees: list[str]
) -> None:
    """systemctl restart ran, the connection dropped before its answer: the retry waits for
    the restart job, sees that containerd restarted, does not restart it again, and says the
    restart was its own (done, journalled as rollout's restart)."""
    runner = (
        ScriptedRunner()
        .on(
            ["systemctl", "show"],
            show(37, at="Sun 2026-11-29 23:38:01 UTC"),
            show(37, at="Sun 2026-11-29 23:38:01 UTC"),
            *retry_sees,
        )
        .on(["systemctl", "restart"], dropped)
    )
    ctx = make_context(tmp_path, runner)
    if written_at is not None:
        ctx.save_data("containerd.write", {"written_at": written_at})
    policy = RetryPolicy(attempts=3, first_wait_s=0)
    result = call_with_policy(lambda: SystemdRestart().apply(ctx), policy, sleep=lambda _: None)
    assert sum(1 for call in runner.calls if call[:2] == ("systemctl", "restart")) == 1
    assert result.kind is StepResultKind.DONE, result.detail
    assert "restarted by an earlier attempt whose answer was lost" in result.detail
    assert "MainPID 37 -> active/running MainPID=88" in result.detail


def test_a_restart_that_never_reached_systemd_is_done_by_the_retry(tmp_path: Path) -> None:
    """The connection dropped before `systemctl restart` reached systemd: the retry finds the
    recorded MainPID still running and restarts."""
    runner = (
        ScriptedRunner()
        .on(
            ["systemctl", "show"],
            *[show(37, at="Sun 2026-11-29 23:38:01 UTC")] * 4,
            show(88, at="Sun 2026-11-29 23:40:00 UTC"),
        )
        .on(["systemctl", "restart"], dropped, "")
    )
    ctx = make_context(tmp_path, runner)
    policy = RetryPolicy(attempts=3, first_wait_s=0)
    result = call_with_policy(lambda: SystemdRestart().apply(ctx), policy, sleep=lambda _: None)
    assert result.kind is StepResultKind.DONE and "MainPID 37 -> 88" in result.detail
    assert sum(1 for call in runner.calls if call[:2] == ("systemctl", "restart")) == 2


def test_a_permanent_error_is_still_a_step_failure(tmp_path: Path) -> None:
    runner = ScriptedRunner().on(["sh", "-c"], failed(2, "sh: cannot open"))
    with pytest.raises(StepFailed, match=r"gpu-1: containerd\.write: "):
        ContainerdWrite().apply(make_context(tmp_path, runner))


# --- the containerd the plan was made for -------------------------------------------------


@dataclass
class FakeNode:
    ready: bool = True
    allocatable: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu": "4"})
    capacity: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu": "4"})


class FakeKube:
    def get_node(self, name: str) -> FakeNode:
        return FakeNode()


def resumed_context(tmp_path: Path, runner: ScriptedRunner) -> StepContext:
    """A resumed run: the plan was made for 1.7.24, fresh facts (and the node) say 1.7.25."""
    ctx = make_context(tmp_path, runner)
    fresh = parse_version("containerd github.com/containerd/containerd v1.7.25 abc\n")
    ctx.facts = dataclasses.replace(ctx.facts, containerd=fresh)
    ctx.kube = cast(KubeClient, FakeKube())
    assert ctx.node_plan.containerd_version == "1.7.24"
    return ctx


def test_preflight_compares_the_node_with_the_plan_not_with_fresh_facts(tmp_path: Path) -> None:
    runner = (
        ScriptedRunner()
        .on(["systemctl", "show"], show(37))
        .on(["containerd", "--version"], "containerd github.com/containerd/containerd v1.7.25 x\n")
    )
    with pytest.raises(StepFailed) as raised:
        Preflight().apply(resumed_context(tmp_path, runner))
    assert "gpu-1: preflight: containerd changed since the plan" in str(raised.value)
    assert "1.7.25 now, 1.7.24 planned" in str(raised.value)


def test_write_compares_the_node_with_the_plan_not_with_fresh_facts(tmp_path: Path) -> None:
    runner = (
        ScriptedRunner()
        .on(["sh", "-c"], listing({MAIN: "version = 2\n", HOSTS: None}))
        .on(["containerd", "--version"], "containerd github.com/containerd/containerd v1.7.25 x\n")
    )
    ctx = resumed_context(tmp_path, runner)
    with pytest.raises(StepFailed, match=r"1\.7\.25 now, 1\.7\.24 planned"):
        ContainerdWrite().apply(ctx)
    assert not runner.ran("mktemp") and not runner.ran("rollout-write")
    assert ctx.load_data("containerd.write") == {}


# --- staging named after the run ----------------------------------------------------------


def test_write_removes_what_the_run_staged_before_and_stages_under_its_name(
    tmp_path: Path,
) -> None:
    stage = "/tmp/rollout-containerd.x.0123456789"

    def shell(argv: Sequence[str]) -> CommandResult:
        name = argv[3]
        if name == "rollout-read":
            return CommandResult(tuple(argv), 0, listing({MAIN: "version = 2\n", HOSTS: None}), "")
        if name == "rollout-unstage":
            return CommandResult(tuple(argv), 0, "", "")
        return CommandResult(tuple(argv), 1, "", "containerd: failed to load config", "gpu-1")

    runner = (
        ScriptedRunner()
        .on(["sh", "-c"], shell)
        .on(["containerd", "--version"], "containerd github.com/containerd/containerd v1.7.24 x\n")
        .on(["mktemp"], stage + "\n")
        .on(["tar"], "")
        .on(["rm"], "")
    )
    ctx = make_context(tmp_path, runner)
    with pytest.raises(StepFailed, match="failed to load config"):
        ContainerdWrite().apply(ctx)
    names = [c[3] if c[:2] == ("sh", "-c") else c[0] for c in runner.calls]
    assert names.index("rollout-unstage") < names.index("mktemp")
    # one read of the node's files serves the drift check and the prediction
    assert names.count("rollout-read") == 1 and "find" not in names
    read = next(c for c in runner.calls if c[3:4] == ("rollout-read",))
    assert read[-2:] == (MAIN, HOSTS)  # the planned files, wherever they lie
    unstage = next(c for c in runner.calls if "rollout-unstage" in c)
    assert unstage[-1] == ctx.run_id
    mktemp = next(c for c in runner.calls if c[0] == "mktemp")
    assert mktemp[-1] == f"rollout-containerd.{ctx.run_id}.XXXXXXXXXX"
    assert ("rm", "-rf", "--", stage) in runner.calls


def test_remove_stages_removes_only_the_owners_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    runner = LocalRunner()

    def make(owner: str) -> Path:
        made = runner.run(["mktemp", "-d", "-t", stage_template(owner)])
        assert made.ok, made.stderr
        path = Path(made.stdout.strip())
        (path / "0" / "etc").mkdir(parents=True)
        return path

    mine = [make("20260101-120000-a-1f2e"), make("20260101-120000-a-1f2e")]
    others = [make("20260101-120000-a-1f2e-b"), make("20260101-120000-b-0000"), make("")]
    remove_stages(runner, "20260101-120000-a-1f2e")
    assert [p.exists() for p in mine] == [False, False]
    assert all(p.is_dir() for p in others)
    remove_stages(runner, "20260101-120000-a-1f2e")  # nothing left: fine
    with pytest.raises(StagingFailed):
        remove_stages(runner, "*")


def test_run_end_cleanup_reports_unreachable_nodes(tmp_path: Path) -> None:
    reachable = ScriptedRunner().on(["sh", "-c"], "")
    broken = ScriptedRunner().on(["sh", "-c"], failed(1, "rm: read-only file system"))
    problems = remove_run_stages({"a": reachable, "b": broken}, "run-1")
    assert list(problems) == ["b"] and "read-only" in problems["b"]
    assert reachable.ran("rollout-unstage", "run-1")


def test_verify_accepts_a_prediction_saved_in_clear_by_an_older_run(tmp_path: Path) -> None:
    """A run journalled before dumps were saved redacted still verifies its node: the saved
    prediction is compared redacted, as the live dump is."""
    auths = '[plugins."io.containerd.grpc.v1.cri".registry.configs."r.example".auth]\n'
    live = RUNC_ONLY_DUMP + auths + 'username = "robot"\npassword = "s3cret"\n'
    runner = verify_runner(live)
    ctx = make_context(tmp_path, runner)
    cri = {
        "containerd": {"runtimes": {"runc": {}}},
        "registry": {
            "configs": {"r.example": {"auth": {"username": "robot", "password": "s3cret"}}}
        },
    }
    saved = {
        "after_dump": {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": cri}},
        "handlers_before": ["runc"],
        "written_at": WRITTEN_AT,
    }
    ctx.save_data("containerd.write", saved)
    result = ContainerdVerify().apply(ctx)
    assert result.kind is StepResultKind.DONE
    assert "s3cret" not in result.detail
