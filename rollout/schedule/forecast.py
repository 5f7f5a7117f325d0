"""How long a rollout will take, and, with a maintenance window, how many windows and which
nodes fall in which.

The nodes of a wave run concurrently, as many at once as max_unavailable allows (less the
nodes already unavailable), and a wave starts when the one before has finished
(rollout/executor.py): a wave lasts as long as its nodes take on that many slots, started in
plan order, and the rollout the sum of its waves. A node's estimate is the sum of its acting
steps: `expected` from each step's mandatory waits and typical work, `worst` from the step's
timeout in the plan's policy (both declared by the step's class, rollout.steps.traits). Once
a run of the same plan has finished nodes, their measured durations replace the expected
figure (their mean, for every node still to do). Windows are filled the same way: a node
starts in a window only when its expected duration still fits before the window closes, else
the window's work ends there and the node opens the next window; the first node of a window
always starts (the executor cannot know better), and one that is longer than any window is
named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from rollout.plan import NodePlan, Plan
from rollout.run import (
    JOURNAL_FILE,
    Entry,
    JournalError,
    NodeFinished,
    NodeOutcome,
    RunIncomplete,
    StepStarted,
    default_state_dir,
    list_runs,
    read_journal,
)
from rollout.run.cluster import SecretApi, find_run
from rollout.schedule.window import nominal_length_s, spans_from
from rollout.spec import Policy, Spec
from rollout.steps import step_traits
from rollout.steps.traits import REQUEST_BOUND_S, StepTraits

# A kind no step class declares (a plan saved by another version): counted at a step's
# worst duration without a timeout of its own.
UNKNOWN_STEP_S = REQUEST_BOUND_S


def step_worst_s(traits: StepTraits, policy: Policy) -> float:
    """The longest a step may take before it fails: its timeout in the plan's policy."""
    return max(traits.worst_s(policy), traits.expected_s)


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
    expected_s: float
    worst_s: float


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
    parallel: int = 1
    time_zone: str = "UTC"

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
            "parallel": self.parallel,
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
    return estimate_steps(acting_kinds(node), policy, step_traits())


def acting_kinds(node: NodePlan) -> tuple[str, ...]:
    """The kinds of the node's steps that act, in order."""
    return tuple(step.kind for step in node.steps if step.changes)


def estimate_steps(
    acting: tuple[str, ...], policy: Policy, traits: Mapping[str, StepTraits]
) -> tuple[float, float]:
    """(expected, worst) seconds for steps of these kinds, by their `traits`."""
    expected = worst = 0.0
    for kind in acting:
        declared = traits.get(kind)
        expected += UNKNOWN_STEP_S if declared is None else declared.expected_s
        worst += UNKNOWN_STEP_S if declared is None else step_worst_s(declared, policy)
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
    parallel = max(1, plan.max_unavailable - len(plan.already_unavailable))
    waves: list[list[NodeForecast]] = []
    estimates: dict[tuple[str, ...], tuple[float, float]] = {}  # a fleet repeats its steps
    traits = step_traits()
    for wave in plan.waves:
        nodes = []
        for node in wave.nodes:
            acting = acting_kinds(node)
            estimate = estimates.get(acting)
            if estimate is None:
                estimate = estimates[acting] = estimate_steps(acting, policy, traits)
            expected, worst = estimate
            if typical is not None and worst > 0:
                nodes.append(
                    NodeForecast(node.name, wave.index, typical, max(worst, typical), True)
                )
            else:
                nodes.append(NodeForecast(node.name, wave.index, expected, worst))
        waves.append(nodes)
    wave_forecasts = tuple(
        WaveForecast(
            plan.waves[i].index,
            tuple(nodes),
            _makespan([n.expected_s for n in nodes if n.changes], parallel),
            _makespan([n.worst_s for n in nodes if n.changes], parallel),
        )
        for i, nodes in enumerate(waves)
    )
    window = policy.maintenance_window
    if window is None:
        return Forecast(wave_forecasts, measured_nodes=len(samples), parallel=parallel)
    length = nominal_length_s(window)
    changing = [[n for n in nodes if n.changes] for nodes in waves]
    packed, too_long = pack_windows(changing, length, parallel)
    if now is not None and packed:
        spans = spans_from(window, now, len(packed))
        packed = [
            WindowForecast(w.index, w.nodes, w.expected_s, span.opens)
            for w, span in zip(packed, spans, strict=True)
        ]
    return Forecast(
        wave_forecasts,
        length,
        tuple(packed),
        tuple(too_long),
        len(samples),
        parallel,
        window.timezone,
    )


def _makespan(durations: list[float], parallel: int) -> float:
    """How long `durations` take on `parallel` slots, each started in order on the first
    slot free."""
    slots = [0.0] * parallel
    for duration in durations:
        free = slots.index(min(slots))
        slots[free] += duration
    return max(slots)


def forecast_for(
    spec: Spec,
    plan: Plan,
    state_dir: Path | None = None,
    now: datetime | None = None,
    scheduled: Mapping[str, float] | None = None,
) -> Forecast:
    """The forecast `rollout plan` prints: measured durations of earlier runs of the plan
    under `state_dir` (default: the run store's) and, winning over those, `scheduled` (the
    plan's scheduled run's, from the cluster); windows dated from `now` (default: now)."""
    measured = measured_durations(state_dir or default_state_dir(), spec.metadata.name)
    measured.update(scheduled or {})
    return forecast_plan(plan, spec.policy, measured, now or datetime.now(UTC))


def pack_windows(
    waves: list[list[NodeForecast]], length_s: float, parallel: int = 1
) -> tuple[list[WindowForecast], list[str]]:
    """Nodes into consecutive windows of `length_s`, as the executor starts them: in plan
    order on `parallel` slots, a wave after the one before; a node that would not finish
    before the close waits for the next window, and so does everything after it."""
    windows: list[WindowForecast] = []
    current: list[str] = []
    slots = [0.0] * parallel
    too_long: list[str] = []

    def close() -> None:
        windows.append(WindowForecast(len(windows) + 1, tuple(current), max(slots)))

    for wave in waves:
        slots = [max(slots)] * parallel  # the wave starts when the last one has finished
        for node in wave:
            if node.expected_s > length_s:
                too_long.append(node.name)
            free = slots.index(min(slots))
            if current and slots[free] + node.expected_s > length_s:
                close()
                current, slots, free = [], [0.0] * parallel, 0
            current.append(node.name)
            slots[free] += node.expected_s
    if current:
        close()
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
        durations = {**node_durations(entries), **durations}
    return durations


def scheduled_durations(kube: SecretApi, namespace: str, plan_name: str) -> dict[str, float]:
    """node_durations of the plan's scheduled run, kept in the cluster (rollout/run/cluster.py);
    empty when it has none yet."""
    found = find_run(kube, namespace, plan_name)
    if found is None:
        return {}
    return node_durations(found.entries())


def node_durations(entries: Iterable[Entry]) -> dict[str, float]:
    """Seconds each node of one run's journal took, from its first step to its success."""
    durations: dict[str, float] = {}
    started: dict[str, datetime] = {}
    for entry in entries:
        record = entry.record
        if isinstance(record, StepStarted):
            started.setdefault(record.node, entry.at)
        elif (
            isinstance(record, NodeFinished)
            and record.node in started
            and record.outcome is NodeOutcome.SUCCEEDED
        ):
            durations.setdefault(record.node, (entry.at - started[record.node]).total_seconds())
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
        f"{format_duration(forecast.worst_s)} at worst ({source}; "
        f"{forecast.parallel} node(s) at a time)"
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
        zone = ZoneInfo(forecast.time_zone)
        for window in forecast.windows:
            opens = window.opens.astimezone(zone) if window.opens else None
            when = f" (opens {opens:%a %Y-%m-%d %H:%M} {forecast.time_zone})" if opens else ""
            lines.append(f"    window {window.index}{when}: {', '.join(window.nodes)}")
        for name in forecast.too_long:
            lines.append(f"    {name} is expected to take longer than a whole window")
    return lines
