"""How long a rollout will take, and, with a maintenance window, how many windows and which
nodes fall in which.

Nodes run one after another (rollout/executor.py), so a wave lasts the sum of its nodes and
the rollout the sum of its waves. A node's estimate is the sum of its acting steps:
`expected` from each step's mandatory waits and typical work (STEP_EXPECTED_S), `worst` from
the step's timeout in the plan's policy. Once a run of the same plan has finished nodes,
their measured durations replace the expected figure (their mean, for every node still to
do). Windows are filled in plan order: a node starts in a window only when its expected
duration still fits before the window closes; the first node of a window always starts
(the executor cannot know better), and one that is longer than any window is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rollout.plan import NodePlan, Plan
from rollout.run import (
    JOURNAL_FILE,
    JournalError,
    NodeFinished,
    NodeOutcome,
    RunIncomplete,
    StepStarted,
    list_runs,
    read_journal,
)
from rollout.schedule.window import nominal_length_s, spans_from
from rollout.spec import Policy

# The typical time of each acting step on a healthy node: its mandatory waits (containerd's
# restart waits for systemd's new MainPID and ActiveState; the device plugin re-registers and
# the kubelet advertises the GPUs again; the smoke pod is scheduled, pulls and runs) plus the
# round trips. Drain waits for the node's pods to leave: their grace period, 30 s by default.
STEP_EXPECTED_S: dict[str, float] = {
    "preflight": 2.0,
    "cordon": 1.0,
    "drain": 30.0,
    "containerd.write": 3.0,
    "systemd.restart": 5.0,
    "containerd.verify": 2.0,
    "gpu.wait": 15.0,
    "gpu.smoke": 20.0,
    "uncordon": 1.0,
    "configmap.update": 1.0,
    "node.label": 1.0,
    "deviceplugin.restart": 15.0,
    "driver.pause": 30.0,
    "driver.unload": 5.0,
    "driver.install": 120.0,
    "driver.reload": 5.0,
    "driver.verify": 2.0,
    "driver.resume": 30.0,
}
# A step without a policy timeout: the request timeouts and retries bound it.
DEFAULT_STEP_WORST_S = 60.0
# drain.timeout_s 0 waits without limit: count a day, the longest timeout the plan accepts.
UNBOUNDED_DRAIN_S = 86_400.0


def step_worst_s(kind: str, policy: Policy) -> float:
    """The longest a step may take before it fails: its timeout in the plan's policy."""
    verify = policy.verify
    timeouts: dict[str, float] = {
        "drain": float(policy.drain.timeout_s or UNBOUNDED_DRAIN_S),
        "systemd.restart": float(verify.containerd_restart_timeout_s),
        "gpu.wait": float(verify.gpu_wait_timeout_s),
        "gpu.smoke": float(verify.smoke_timeout_s),
        "deviceplugin.restart": float(verify.gpu_wait_timeout_s),
        "driver.install": 1800.0,
    }
    return max(timeouts.get(kind, DEFAULT_STEP_WORST_S), STEP_EXPECTED_S.get(kind, 0.0))


@dataclass(frozen=True)
class NodeForecast:
    name: str
    wave: int
    expected_s: float
    worst_s: float
    measured: bool = False

    @property
    def changes(self) -> bool:
        return self.worst_s > 0


@dataclass(frozen=True)
class WaveForecast:
    index: int
    nodes: tuple[NodeForecast, ...]

    @property
    def expected_s(self) -> float:
        return sum(n.expected_s for n in self.nodes)

    @property
    def worst_s(self) -> float:
        return sum(n.worst_s for n in self.nodes)


@dataclass(frozen=True)
class WindowForecast:
    """One window's share of the rollout; `opens` is set when the forecast had a clock."""

    index: int
    nodes: tuple[str, ...]
    expected_s: float
    opens: datetime | None = None


@dataclass(frozen=True)
class Forecast:
    waves: tuple[WaveForecast, ...]
    window_length_s: int | None = None
    windows: tuple[WindowForecast, ...] = ()
    too_long: tuple[str, ...] = ()  # nodes expected to outlast a whole window
    measured_nodes: int = 0

    @property
    def expected_s(self) -> float:
        return sum(w.expected_s for w in self.waves)

    @property
    def worst_s(self) -> float:
        return sum(w.worst_s for w in self.waves)

    def to_data(self) -> dict[str, object]:
        """The forecast as JSON-ready data."""
        return {
            "expected_s": round(self.expected_s),
            "worst_s": round(self.worst_s),
            "measured_nodes": self.measured_nodes,
            "waves": [
                {
                    "wave": w.index,
                    "expected_s": round(w.expected_s),
                    "worst_s": round(w.worst_s),
                    "nodes": [n.name for n in w.nodes if n.changes],
                }
                for w in self.waves
            ],
            "window_length_s": self.window_length_s,
            "windows": [
                {
                    "window": w.index,
                    "opens": w.opens.isoformat() if w.opens else None,
                    "expected_s": round(w.expected_s),
                    "nodes": list(w.nodes),
                }
                for w in self.windows
            ],
            "too_long": list(self.too_long),
        }


def node_estimate(node: NodePlan, policy: Policy) -> tuple[float, float]:
    """(expected, worst) seconds for the node's acting steps; (0, 0) when nothing changes."""
    acting = [step.kind for step in node.steps if step.changes]
    expected = sum(STEP_EXPECTED_S.get(kind, DEFAULT_STEP_WORST_S) for kind in acting)
    worst = sum(step_worst_s(kind, policy) for kind in acting)
    return expected, worst


def forecast_plan(
    plan: Plan,
    policy: Policy,
    measured: Mapping[str, float] | None = None,
    now: datetime | None = None,
) -> Forecast:
    """The forecast of `plan` under `policy`; `measured` are earlier nodes' durations (s) of
    the same plan; `now` dates the windows (None: windows are only counted)."""
    samples = list((measured or {}).values())
    typical = sum(samples) / len(samples) if samples else None
    waves = []
    for wave in plan.waves:
        nodes = []
        for node in wave.nodes:
            expected, worst = node_estimate(node, policy)
            if typical is not None and worst > 0:
                nodes.append(
                    NodeForecast(node.name, wave.index, typical, max(worst, typical), True)
                )
            else:
                nodes.append(NodeForecast(node.name, wave.index, expected, worst))
        waves.append(WaveForecast(wave.index, tuple(nodes)))
    window = policy.maintenance_window
    if window is None:
        return Forecast(tuple(waves), measured_nodes=len(samples))
    length = nominal_length_s(window)
    packed, too_long = pack_windows([n for w in waves for n in w.nodes if n.changes], length)
    if now is not None and packed:
        spans = spans_from(window, now, len(packed))
        packed = [
            WindowForecast(w.index, w.nodes, w.expected_s, span.opens)
            for w, span in zip(packed, spans, strict=True)
        ]
    return Forecast(tuple(waves), length, tuple(packed), tuple(too_long), len(samples))


def pack_windows(
    nodes: list[NodeForecast], length_s: float
) -> tuple[list[WindowForecast], list[str]]:
    """Nodes into consecutive windows of `length_s`, in order, as the executor starts them."""
    windows: list[WindowForecast] = []
    current: list[str] = []
    used = 0.0
    too_long: list[str] = []
    for node in nodes:
        if node.expected_s > length_s:
            too_long.append(node.name)
        if current and used + node.expected_s > length_s:
            windows.append(WindowForecast(len(windows) + 1, tuple(current), used))
            current, used = [], 0.0
        current.append(node.name)
        used += node.expected_s
    if current:
        windows.append(WindowForecast(len(windows) + 1, tuple(current), used))
    return windows, too_long


def measured_durations(state_dir: Path, plan_name: str) -> dict[str, float]:
    """Seconds each node took, from its first step to its success, in earlier runs of the
    plan named `plan_name` under `state_dir` (the newest run's figure wins)."""
    durations: dict[str, float] = {}
    for run in list_runs(state_dir):
        if run.plan_name != plan_name or run.problem:
            continue
        try:
            entries = read_journal(run.run_dir / JOURNAL_FILE).entries
        except (JournalError, RunIncomplete, OSError):
            continue
        started: dict[str, datetime] = {}
        for entry in entries:
            record = entry.record
            if isinstance(record, StepStarted):
                started.setdefault(record.node, entry.at)
            elif (
                isinstance(record, NodeFinished)
                and record.node in started
                and record.outcome is NodeOutcome.SUCCEEDED
                and record.node not in durations
            ):
                durations[record.node] = (entry.at - started[record.node]).total_seconds()
    return durations


def format_duration(seconds: float) -> str:
    """`45s`, `12m 5s`, `3h 20m`."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"


def forecast_lines(forecast: Forecast) -> list[str]:
    """The forecast as plain text lines, for the plan's text and markdown output."""
    source = (
        f"measured on {forecast.measured_nodes} node(s) of an earlier run"
        if forecast.measured_nodes
        else "from the steps' typical waits; worst case from their timeouts"
    )
    lines = [
        f"forecast: {format_duration(forecast.expected_s)} expected, "
        f"{format_duration(forecast.worst_s)} at worst ({source})"
    ]
    for wave in forecast.waves:
        lines.append(
            f"  wave {wave.index}: {format_duration(wave.expected_s)} expected, "
            f"{format_duration(wave.worst_s)} at worst"
        )
    if forecast.window_length_s is not None:
        count = len(forecast.windows)
        lines.append(
            f"  maintenance windows of {format_duration(forecast.window_length_s)}: "
            f"{count} window(s) needed"
        )
        for window in forecast.windows:
            when = f" (opens {window.opens:%a %Y-%m-%d %H:%M %Z})" if window.opens else ""
            lines.append(f"    window {window.index}{when}: {', '.join(window.nodes)}")
        for name in forecast.too_long:
            lines.append(f"    {name} is expected to take longer than a whole window")
    return lines
