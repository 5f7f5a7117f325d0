"""The lab's fault decisions are repeatable per seed: they key on the command a session ran
(or the API request) with its random parts (run id, fact frame, mktemp names, a smoke pod's
hex, a watch's resourceVersion) replaced, so two runs that send the same commands, differing
only in what rollout chose at random, get the same faults.

The commands are made by rollout's own code (a recording runner behind SshRunner's command
line), so a change of what rollout puts at random in a command fails here, not in a lab."""

from __future__ import annotations

import contextlib
import random
import shlex
import string
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rollout.commands import CommandResult
from rollout.containerd.files import ConfigFiles
from rollout.containerd.staging import dump_configs, remove_stages
from rollout.errors import RolloutError
from rollout.facts.batch import read_facts
from rollout.facts.containerd import ContainerdVersionFact
from rollout.facts.service import ServiceFact
from rollout.inventory import Host
from rollout.lab.apiserver.faults import ApiFaultInjector
from rollout.lab.faults import (
    RANDOM_PARTS,
    SSH_KINDS,
    decide,
    parse_fault_spec,
    without_random_parts,
    write_settings,
)
from rollout.lab.sshfaults import decision_key
from rollout.run.files import make_run_id
from rollout.steps.backup import back_up_file, backup_path_for
from rollout.steps.gpu_smoke import smoke_pod_name
from rollout.transports.runner import ArgvRunner
from rollout.transports.ssh import SshRunner

NODE = "lab-node-1"
SEEDS = range(20)


class Recording(ArgvRunner):
    """Records each command line as the node's sshd runs it (`bash -c LINE`); answers
    `mktemp` with a fresh random name, as mktemp does, and fails everything else."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._ssh = SshRunner(Host(name=NODE, address="127.0.0.1"))
        self.lines: list[str] = []

    @property
    def host(self) -> str:
        return NODE

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        self.lines.append("bash -c " + self._ssh.command_line(argv, timeout_s))
        if argv[0] == "mktemp":
            letters = string.ascii_letters + string.digits
            made = argv[-1].replace("XXXXXXXXXX", "".join(self._rng.choices(letters, k=10)))
            return CommandResult(argv, 0, f"/tmp/{made}\n", "", NODE)
        return CommandResult(argv, 1, "", "refused by the test", NODE)


def one_run(seed: int, started: datetime) -> list[str]:
    """The command lines one run of rollout sends a node (its random choices seeded here)."""
    random.seed(seed)  # the parts rollout draws from `secrets` differ anyway
    runner = Recording(random.Random(seed))
    run_id = make_run_id("lab demo", started)
    files = ConfigFiles("/etc/containerd/config.toml", {"/etc/containerd/config.toml": ""})
    for _ in range(2):  # a command sent twice is a second sight of one request
        with contextlib.suppress(RolloutError, ValueError):
            read_facts(runner, [ContainerdVersionFact(), ServiceFact("containerd")])
    for owner in (run_id, ""):
        with contextlib.suppress(RolloutError):
            dump_configs(runner, "containerd", [files], owner=owner)
    for path in ("/etc/containerd/config.toml", "/etc/containerd/conf.d/10-mirror.toml"):
        with contextlib.suppress(RolloutError):
            back_up_file(runner, path, backup_path_for(run_id, path))
    with contextlib.suppress(RolloutError):
        remove_stages(runner, run_id)
    return runner.lines


def decisions(seed: int, lines: list[str]) -> list[object]:
    """The injector's decisions for these lines, in order (rollout.lab.sshfaults)."""
    seen: Counter[str] = Counter()
    made: list[object] = []
    for line in lines:
        request = f"{NODE} {decision_key(line)}"
        made.append(decide(seed, 0.3, request, seen[request], SSH_KINDS))
        seen[request] += 1
    return made


def test_two_runs_differing_only_in_random_parts_get_the_same_faults() -> None:
    first = one_run(1, datetime(2026, 12, 1, 18, 33, 55, tzinfo=UTC))
    second = one_run(2, datetime(2026, 12, 2, 7, 1, 2, tzinfo=UTC) + timedelta(seconds=1))
    assert len(first) == len(second) > 10
    same = [a for a, b in zip(first, second, strict=True) if a == b]
    # every line but a template holds a random part, so keyed raw ...
    assert same == [
        "bash -c timeout --kill-after=5s 60.000s mktemp -d -t rollout-containerd.XXXXXXXXXX"
    ]
    assert [decision_key(line) for line in first] == [decision_key(line) for line in second]
    for seed in SEEDS:  # ... they would be faulted at random, keyed normalised they are not
        assert decisions(seed, first) == decisions(seed, second), seed
    assert any(any(decisions(seed, first)) for seed in SEEDS)


def test_each_random_part_has_its_placeholder_and_the_rest_stays() -> None:
    lines = one_run(3, datetime(2026, 12, 1, 18, 33, 55, tzinfo=UTC))
    keys = [decision_key(line) for line in lines]
    text = "\n".join(keys)
    assert "rollout-fact-<boundary>" in text and "rollout-fact-" not in text.replace(
        "rollout-fact-<boundary>", ""
    )
    assert "/var/lib/rollout/backups/<run>-lab-demo-<hex>/etc/containerd/config.toml" in text
    assert "rollout-containerd.<run>-lab-demo-<hex>.<mktemp>" in text  # a run's staging
    assert "/tmp/rollout-containerd.<mktemp>" in text  # a staging without an owner
    # different commands keep different keys: two files' backups, the fact batch and its
    # second sight the same
    backups = [k for k in keys if "rollout-backup" in k]
    assert len(set(backups)) == 2
    batches = [k for k in keys if "rollout-probe" in k]
    assert len(batches) == 2 and len(set(batches)) == 1
    # the shell and quoting go as before (asked_command); a line with no random part is kept
    assert decision_key("bash -c 'timeout 60s cat /etc/hostname'") == (
        "timeout 60s cat /etc/hostname"
    )


def test_what_is_not_random_is_not_replaced() -> None:
    kept = [
        "systemctl show containerd -p MainPID",
        "cat /var/lib/rollout/backups",  # no run id
        "mktemp -d -t rollout-containerd.XXXXXXXXX",  # nine Xs: not mktemp's ten
        "sha256sum -- /etc/containerd/conf.d/99-nvidia.toml",
        "nvidia-smi --query-gpu=uuid,name,driver_version --format=csv,noheader",
        "echo 20261201-1833-abcd",  # not a run id's stamp
    ]
    assert [decision_key(shlex.join(line.split())) for line in kept] == kept
    assert len(RANDOM_PARTS) == 5


def api_requests(run_id: str, resource_version: int) -> list[str]:
    """API paths one run asks for: its smoke pod, a watch from a list's version."""
    pod = f"/api/v1/namespaces/default/pods/{smoke_pod_name('lab-node-1', run_id)}"
    watch = f"/api/v1/pods?watch=true&resourceVersion={resource_version}&fieldSelector=x"
    return [pod, f"{pod}/log", watch, pod, watch]


def test_api_requests_differing_only_in_random_parts_get_the_same_faults(tmp_path: Path) -> None:
    runs = [
        api_requests(make_run_id("lab demo", datetime(2026, 12, 1, tzinfo=UTC)), 1041),
        api_requests(make_run_id("lab demo", datetime(2026, 12, 2, tzinfo=UTC)), 1187),
    ]
    assert runs[0] != runs[1]
    for seed in SEEDS:
        chosen = []
        for paths in runs:
            write_settings(tmp_path, parse_fault_spec("api=0.3", seed))
            injector = ApiFaultInjector(tmp_path)  # a fresh lab: nothing seen yet
            picks = [injector.choose("GET", p, watch="watch=" in p) for p in paths]
            chosen.append([None if c is None else c.kind for c in picks])
        assert chosen[0] == chosen[1], seed
    assert without_random_parts(runs[0][1]).endswith("/pods/rollout-smoke-lab-node-1-<hex>/log")
    assert "&resourceVersion=<rv>&" in without_random_parts(runs[1][2])
    assert any(c is not None for c in chosen[0])
