"""The lab's stand-in dmesg shows the current boot only, as the kernel's ring buffer does: the
kernel-log file outlives a node's reboot, and without this an Xid logged before a host-driver
upgrade's reboot would count as new for the Xid gate (a new boot id: every line it reads is
of this boot)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rollout.lab import nodes

DMESG = Path(nodes.__file__).parent / "data" / "dmesg"


def dmesg(tmp_path: Path, log: str, booted_at_ticks: int) -> str:
    """The stand-in's output over `log`, PID 1 started `booted_at_ticks` after the host."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    fields = ["1", "(systemd)", "S", *["0"] * 18, str(booted_at_ticks), "100"]
    (proc / "1" / "stat").write_text(" ".join(fields) + "\n")
    kern = tmp_path / "kern.log"
    kern.write_text(log)
    env = {**os.environ, "ROLLOUT_LAB_PROC": str(proc), "ROLLOUT_LAB_KERNEL_LOG": str(kern)}
    result = subprocess.run(["sh", str(DMESG)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def hz() -> int:
    return int(subprocess.run(["getconf", "CLK_TCK"], capture_output=True, text=True).stdout)


def test_lines_stamped_before_the_nodes_boot_are_left_out(tmp_path: Path) -> None:
    log = (
        "[  100.000000] NVRM: Xid (PCI:0000:07:00): 79, before the reboot\n"
        "[  500.250000] NVRM: Xid (PCI:0000:07:00): 79, after it\n"
        "a line without a stamp\n"
    )
    shown = dmesg(tmp_path, log, booted_at_ticks=300 * hz())
    assert shown == (
        "[  500.250000] NVRM: Xid (PCI:0000:07:00): 79, after it\na line without a stamp\n"
    )


def test_a_node_booted_before_every_line_shows_them_all(tmp_path: Path) -> None:
    log = "[   12.500000] NVRM: Xid (PCI:0000:07:00): 79, x\n[   13.000000] y\n"
    assert dmesg(tmp_path, log, booted_at_ticks=5 * hz()) == log


def test_no_log_prints_nothing(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    env = {**os.environ, "ROLLOUT_LAB_PROC": str(tmp_path / "proc"),
           "ROLLOUT_LAB_KERNEL_LOG": str(tmp_path / "missing")}  # fmt: skip
    result = subprocess.run(["sh", str(DMESG)], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == ""
