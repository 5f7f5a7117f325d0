"""`rollout lab up --faults SPEC --seed N` on a one-node lab of its own, through the CLI.

The faults are in force once `lab up` returns; the same seed faults the same commands again;
and a `slow-link` fault really slows the node's link (tc on the host's loopback, filtered on
the node's address) for `link` seconds, then gives the link its speed back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from rollout.cli import main
from rollout.lab import linkshaper
from rollout.lab.cluster import Lab
from rollout.lab.faults import parse_fault_spec, read_fault_log, read_settings
from tests.lab.labapi import wait_for
from tests.lab.test_cluster_shared import OWN_ADDRESS_PREFIX, require_lab_prerequisites, ssh_run

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

UP_FAULTS = "ssh=1,ssh-kinds=slow-link,link=3,link-rate=128"
SEED = 5


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_lab_prerequisites()
    lab_dir = tmp_path_factory.mktemp("lab-faults") / "lab"
    up = ["lab", "up", "--lab-dir", str(lab_dir), "--nodes", "1", "--containerd", "1.7"]
    up += ["--gpus", "1", "--address-prefix", OWN_ADDRESS_PREFIX, "--api-port", "0"]
    try:
        assert main([*up, "--faults", UP_FAULTS, "--seed", str(SEED)]) == 0
        yield Lab.from_lab_dir(lab_dir)
    finally:
        main(["lab", "down", "--lab-dir", str(lab_dir)])


def faulted_since(lab: Lab, before: int) -> list[tuple[str, str]]:
    """(request, fault) of the faults the lab injected after the first `before`."""
    return [(f.request, f.fault) for f in read_fault_log(lab.lab_dir)[before:]]


def test_lab_up_faults_slow_the_nodes_link_then_restore_it(lab: Lab) -> None:
    assert read_settings(lab.lab_dir) == parse_fault_spec(UP_FAULTS, SEED)
    node = lab.nodes[0]
    size = 32_000  # at 128 kbit/s, about 2 s: far more than the loopback's microseconds
    started = time.monotonic()
    # the pause lets the lab's watcher see the command and slow the link before bytes flow
    result = ssh_run(lab, node, ["sh", "-c", f"sleep 0.5; head -c {size} /dev/zero"])
    took = time.monotonic() - started
    assert result.ok and len(result.stdout) == size
    assert linkshaper.slowed([node.address]) == [node.address], "slow for `link` seconds"
    assert took > 1.5, f"{size} bytes at 128 kbit/s came back in {took:.2f} s"
    faults = faulted_since(lab, 0)
    assert any(f"head -c {size}" in r and f == "slow-link" for r, f in faults), faults
    wait_for(lambda: not linkshaper.slowed([node.address]), 10.0, what="the link restored")
    assert main(["lab", "faults", "off", "--lab-dir", str(lab.lab_dir)]) == 0
    before = len(read_fault_log(lab.lab_dir))
    assert ssh_run(lab, node, ["sh", "-c", "sleep 0.3; true"]).ok
    assert faulted_since(lab, before) == [] and linkshaper.slowed([node.address]) == []


def test_the_same_seed_faults_the_same_commands(lab: Lab) -> None:
    def faulted_with(seed: int) -> list[str]:
        spec = "ssh=0.5,ssh-kinds=slow-link,link=0.1"
        assert (
            main(["lab", "faults", spec, "--seed", str(seed), "--lab-dir", str(lab.lab_dir)]) == 0
        )
        before = len(read_fault_log(lab.lab_dir))
        # eight distinct commands, each long enough to be seen: the watcher polls every 20 ms
        # but is busy while it throttles a link (tc), so a command under a second ran past it
        # unseen on a loaded machine (a CI run missed "sleep 0.25" right after "sleep 0.24")
        for pause in range(21, 29):
            ssh_run(lab, lab.nodes[0], ["sleep", f"1.{pause}"])
        time.sleep(0.3)  # the last slow link restored
        return [request for request, _ in faulted_since(lab, before)]

    seed = 3  # at this seed, rollout.lab.faults.decide (pure) faults three of the eight
    first = faulted_with(seed)
    assert first == ["sleep 1.22", "sleep 1.24", "sleep 1.26"]
    assert faulted_with(seed) == first
    assert faulted_with(seed + 1) != first
    main(["lab", "faults", "off", "--lab-dir", str(lab.lab_dir)])
