"""`rollout facts record`: probe a cluster once, write its facts for review elsewhere."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rollout.cli import add_command, add_listed_command
from rollout.cli.plan import add_fleet_arguments, connect_fleet, limit_of, limited_runners
from rollout.cli.render import show_controls
from rollout.errors import BadInput, ExitCode
from rollout.facts.extra import with_hosts_files, with_plan_facts
from rollout.facts.live import gather_diagnosis_facts, read_plan_nvidia_drivers
from rollout.facts.recording import record_fleet
from rollout.spec import load_spec

HELP = """\
Probe every node of the inventory over SSH and the cluster through the Kubernetes API, and
write the facts in the layout `rollout plan --facts` and `rollout diagnose --facts` read:
DIR/<node>/node.yaml, DIR/<node>/files/etc/containerd/..., DIR/cluster.yaml. Registry
credentials are redacted before they are written.

Some plans need facts of their own: a registry change's hosts.toml under a config_path
outside /etc/containerd is read with the node's files, a `mode: host` driver upgrade reads
each node's driver packages, holds and the apt candidates for its version, a `mode: operator`
one the running kernel. With --plan PLAN those are recorded too, so that
`rollout plan PLAN --facts DIR` gives the plan the live `rollout plan PLAN` would.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "facts")
    verbs = parser.add_subparsers(dest="facts_command", metavar="VERB")
    record = add_command(
        verbs,
        "record",
        HELP,
        help="probe the cluster and write its facts into DIR",
        as_written=True,
    )
    record.add_argument("directory", metavar="DIR", type=Path, help="a new, empty directory")
    record.add_argument(
        "--plan",
        metavar="PLAN",
        type=Path,
        help="also record the facts this plan's changes need (driver upgrades, the "
        "NVIDIADriver resources a change names)",
    )
    add_fleet_arguments(record)
    record.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    if args.inventory is None:
        raise BadInput("facts record probes the nodes: pass --inventory FILE (and --kubeconfig)")
    if args.directory.exists() and not args.directory.is_dir():
        raise BadInput(f"{args.directory}: exists and is not a directory")
    spec = load_spec(args.plan) if args.plan is not None else None  # bad input: nothing probed
    limit = limit_of(args)
    with connect_fleet(args) as connection:
        runners = limited_runners(connection.runners, limit, str(args.inventory))
        fleet, unreachable = gather_diagnosis_facts(
            runners, connection.kube, max_parallel=args.parallel, source=str(args.inventory)
        )
        if limit is not None:  # label selectors: decided once the labels are read
            named = [(n.name, n.labels) for n in fleet.nodes]
            chosen = set(limit.select(named + [(n, {}) for n in unreachable], fleet.source))
            fleet = dataclasses.replace(
                fleet, nodes=tuple(n for n in fleet.nodes if n.name in chosen)
            )
            unreachable = {n: why for n, why in unreachable.items() if n in chosen}
        if spec is not None:
            # diagnosis facts read the files without the plan: its hosts.toml files outside
            # /etc/containerd are read with them again
            nodes = with_hosts_files(spec, runners, fleet.nodes, args.parallel)
            nodes = with_plan_facts(spec, runners, nodes, args.parallel)
            drivers = read_plan_nvidia_drivers(spec, connection.kube)
            cluster = dataclasses.replace(fleet.cluster, nvidia_drivers=drivers)
            fleet = dataclasses.replace(fleet, nodes=tuple(nodes), cluster=cluster)
    for name, why in unreachable.items():
        print(f"not recorded: {show_controls(name)}: {show_controls(why)}", file=sys.stderr)
    written = record_fleet(fleet, args.directory)
    print(
        f"recorded {len(fleet.nodes)} node(s), {len(written)} file(s) into "
        f"{show_controls(str(args.directory))}",
        file=sys.stderr,
    )
    return ExitCode.FAILED if unreachable else ExitCode.OK
