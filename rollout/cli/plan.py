"""`rollout plan`: what would change, node by node, without touching anything."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rollout.cli import add_listed_command
from rollout.cli.colors import add_color_options, chosen_color
from rollout.cli.documents import DOCUMENT_FORMATS, write_plan_document
from rollout.cli.render import make_console
from rollout.cli.render_groups import plan_markdown, print_plan
from rollout.errors import BadInput, ExitCode
from rollout.facts import FleetFacts, load_recorded_facts
from rollout.facts.progress import StreamProgress
from rollout.inputs.inputfile import input_name, read_text
from rollout.limit import NodeLimit
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import Spec, parse_spec

if TYPE_CHECKING:
    from rollout.connection import FleetConnection


def __getattr__(name: str) -> object:
    """FleetConnection, imported on first use: SSH and the Kubernetes client (fabric,
    paramiko, kubernetes) load only where a fleet is reached, never for `plan --facts`."""
    if name == "FleetConnection":
        from rollout.connection import FleetConnection

        globals()[name] = FleetConnection
        return FleetConnection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


R = TypeVar("R")

HELP = """\
Show what `rollout apply` would do: the waves, each node's steps (or why a step is a
no-op), unified diffs of every file written, the EFFECTIVE containerd config diff (what
containerd will load, not just what the files say) and any drop-in that shadows another.
Nothing is changed.
"""

EPILOG = """\
facts:
  --inventory FILE probes every node of the inventory over SSH (containerd --version, every
  file under /etc/containerd, nvidia-smi) and reads labels and status from the Kubernetes API.
  --facts DIR reads recorded facts: DIR/<node>/node.yaml (containerd --version output,
  labels, GPUs) and DIR/<node>/files/... (the node's /etc/containerd tree). `rollout init`
  writes facts/, a mixed 1.6/1.7/2.1 fleet, with plan.yaml and inventory/.

examples (in the directory `rollout init` wrote):
  rollout plan plan.yaml --facts facts
  rollout plan plan.yaml --facts facts --output markdown > plan.md
  rollout plan plan.yaml --facts facts --detailed-exitcode; echo $?
  rollout plan plan.yaml -i inventory/example.yaml --kubeconfig ~/.kube/config
  rollout plan plan.yaml -i LAB/inventory.yaml --kubeconfig LAB/kubeconfig   # after rollout lab up
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "plan", HELP, EPILOG, as_written=True)
    parser.add_argument(
        "plan_file", metavar="PLAN", type=Path, help="the plan.yaml (- reads standard input)"
    )
    parser.add_argument(
        "--facts",
        metavar="DIR",
        type=Path,
        help="plan from recorded node facts instead of probing the cluster",
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--output",
        "-o",
        choices=("text", "markdown", "json", "yaml"),
        default="text",
        help="text for a terminal (default), markdown for a review comment, json or yaml for tools",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="text and markdown: every node with its own diffs, instead of each group of "
        "nodes planned alike once",
    )
    parser.add_argument(
        "--schedule-namespace",
        metavar="NS",
        help="live facts: the forecast also uses the node durations measured by the plan's "
        "scheduled run, kept in the cluster in namespace NS (`rollout schedule --namespace`)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        type=Path,
        help="also save what is shown to FILE (no secret in it): `rollout show FILE` renders "
        "it, `rollout apply FILE` runs exactly it",
    )
    parser.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing would change, 2 when something would, 1 on error",
    )
    add_color_options(parser)
    parser.set_defaults(func=run_plan)


def connect_fleet(args: argparse.Namespace) -> FleetConnection:
    """The fleet named by the --inventory, --kubeconfig and --context arguments."""
    # looked up on the module (see __getattr__), where a test may put a stand-in
    connection: type[FleetConnection] = sys.modules[__name__].FleetConnection
    return connection(
        args.inventory,
        args.kubeconfig,
        args.context,
        accept_new_host_keys=args.accept_new_host_keys,
        handshake_timeout_s=args.handshake_timeout,
    )


def gather_live_facts(spec: Spec, args: argparse.Namespace) -> tuple[FleetFacts, dict[str, float]]:
    """Probe the inventory's nodes over SSH and the cluster through the Kubernetes API; with
    --schedule-namespace, also the durations the plan's scheduled run measured."""
    with connect_fleet(args) as fleet:
        print(
            f"gathering facts from {len(fleet.runners)} node(s) over SSH and the Kubernetes API"
            f" ({args.parallel} at once)",
            file=sys.stderr,
        )
        progress = StreamProgress(sys.stderr, len(fleet.runners))
        try:
            facts = fleet.gather(spec, max_parallel=args.parallel, progress=progress, release=True)
        finally:
            progress.finish()
        if args.schedule_namespace is None:
            return facts, {}
        from rollout.schedule.forecast import scheduled_durations

        name = spec.metadata.name
        return facts, scheduled_durations(fleet.kube, args.schedule_namespace, name)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """--inventory, --kubeconfig, --context, --accept-new-host-keys, --parallel."""
    parser.add_argument(
        "--inventory",
        "-i",
        metavar="FILE",
        type=Path,
        help="live facts: the nodes to probe over SSH (rollout YAML, Ansible INI or YAML)",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="like kubectl (default: $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="add unknown SSH host keys to known_hosts (a changed key is always refused)",
    )
    parser.add_argument(
        "--parallel",
        type=parallel_count,
        default=DEFAULT_PARALLEL,
        metavar="N",
        help=f"probe at most N nodes at once (1 to {MAX_PARALLEL}; default {DEFAULT_PARALLEL})",
    )
    parser.add_argument(
        "--handshake-timeout",
        type=handshake_seconds,
        metavar="SECONDS",
        help="give up on a node whose port accepts connections but which completes no SSH "
        "handshake within SECONDS, without retrying (default 10)",
    )
    parser.add_argument(
        "--limit",
        "-l",
        metavar="PATTERN",
        help="only these nodes (Ansible's --limit): names, globs, @FILE, key=value label "
        "selectors, joined by ',' or ':'; '!P' leaves P out, '&P' requires it",
    )


def limit_of(args: argparse.Namespace) -> NodeLimit | None:
    """The command's --limit, parsed (None without one)."""
    return None if args.limit is None else NodeLimit.from_text(args.limit)


def limited_runners(runners: Mapping[str, R], limit: NodeLimit | None, where: str) -> dict[str, R]:
    """The runners of the nodes to probe: within `limit` when names alone decide it (a label
    selector is decided once the labels are read, so every node is probed then)."""
    if limit is None or limit.needs_labels:
        return dict(runners)
    chosen = set(limit.select(((name, {}) for name in runners), where))
    return {name: runner for name, runner in runners.items() if name in chosen}


# More SSH sessions at once than this only queue in the kernel and in sshd's MaxStartups.
MAX_PARALLEL = 256
# A laptop's default: a probe mostly waits on the node and the network (201 endpoints cost
# plan 4.4 s of CPU in all; bench/endpoints.md), so 32 at once keep a fleet moving while a
# laptop's cores and file descriptors stay far from their limits.
DEFAULT_PARALLEL = 32


def handshake_seconds(text: str) -> float:
    """--handshake-timeout SECONDS: a number from 1 to 300 (argparse reports the error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, found {text[:40]!r}") from None
    if not 1 <= value <= 300:
        raise argparse.ArgumentTypeError(f"expected 1 to 300 seconds, found {value:g}")
    return value


def parallel_count(text: str) -> int:
    """--parallel N: a whole number from 1 to MAX_PARALLEL (argparse reports the error)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {MAX_PARALLEL}, found {text[:40]!r}"
        ) from None
    if not 1 <= value <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {MAX_PARALLEL}, found {value}"
        )
    return value


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection inside the block: reading a fleet's facts builds millions of
    objects that live on and no reference cycles (but a bad node's error), which the
    collector would otherwise walk again on each of its full collections; importing
    kubernetes' API classes (hundreds of models, thousands of validators) likewise."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_plan(args: argparse.Namespace) -> int:
    if args.facts is not None and args.inventory is not None:
        raise BadInput(
            "--facts and --inventory both name where facts come from; pass one of them"
            " (--facts DIR plans from recorded facts, --inventory FILE probes the nodes)"
        )
    # read once (`-` is standard input): what --out saves is the text planned
    spec_text = read_text(args.plan_file)
    spec = parse_spec(spec_text, input_name(args.plan_file))
    limit = limit_of(args)  # bad input: nothing probed
    scheduled: dict[str, float] = {}
    if args.facts is not None and args.schedule_namespace is not None:
        raise BadInput(
            "--schedule-namespace reads the scheduled run from the cluster, which --facts "
            "plans without; pass --inventory FILE (with --kubeconfig/--context) instead"
        )
    if args.facts is not None:
        with _collector_paused():
            fleet = load_recorded_facts(args.facts)
    elif args.inventory is not None:
        # the SSH and Kubernetes libraries are imported meanwhile: objects that live on
        with _collector_paused():
            fleet, scheduled = gather_live_facts(spec, args)
    else:
        raise BadInput(
            "where do the facts come from? pass --inventory FILE (with --kubeconfig/--context) "
            "to probe the nodes, or --facts DIR for recorded facts"
        )
    # the facts and the plan live until the command ends: a fleet's are millions of objects,
    # which the garbage collector would otherwise walk again on each full collection
    gc.freeze()
    plan = build_plan(spec, input_name(args.plan_file), fleet, load_playbooks(), limit)
    gc.freeze()
    from rollout.cli.render import forecast_to_markdown, print_forecast
    from rollout.schedule.forecast import forecast_for, forecast_lines

    # how long, and in which maintenance windows
    forecast = forecast_for(spec, plan, scheduled=scheduled)
    if args.out is not None:
        from rollout.cli.show import save_plan

        save_plan(args.out, plan, fleet, (input_name(args.plan_file), spec_text), forecast)
    if args.output in DOCUMENT_FORMATS:
        write_plan_document(plan, args.output, sys.stdout, forecast.to_data())
    elif args.output == "markdown":
        sys.stdout.write(
            plan_markdown(plan, args.full) + forecast_to_markdown(forecast_lines(forecast))
        )
    else:
        color = chosen_color(args)
        console = make_console(sys.stdout, color)
        print_plan(plan, console, args.full)
        print_forecast(forecast_lines(forecast), console)
    if args.detailed_exitcode:
        # terraform's convention: 2 = changes pending, so CI can tell "plan is empty" apart
        return 2 if plan.has_changes else ExitCode.OK
    return ExitCode.OK
