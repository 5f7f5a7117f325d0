"""`rollout lab up|down|status`: a local lab cluster for rehearsal, demos and tests."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from rollout.cli import add_command, add_listed_command
from rollout.errors import BadInput
from rollout.inputs.fieldproblems import shorten
from rollout.lab.cluster import (
    DEFAULT_ADDRESS_PREFIX,
    DEFAULT_API_PORT,
    DEFAULT_GPUS,
    DEFAULT_NODES,
    DEFAULT_SERIES,
    Lab,
    LabOptions,
    LabStatus,
    bring_up_lab,
    default_lab_dir,
    format_usage,
    read_lab_status,
    tear_down_lab,
)
from rollout.lab.controlplane_process import LOG_FILE
from rollout.lab.driverpools import split_driver_pools
from rollout.lab.endpoints import DEFAULT_ENDPOINT_PREFIX
from rollout.lab.faults import (
    SPEC_HELP,
    parse_fault_spec,
    read_fault_log,
    read_settings,
    write_settings,
)
from rollout.lab.image import SERIES
from rollout.lab.nodefaults import boot_node_again, kill_lab_node
from rollout.lab.scenarios import (
    SCENARIOS,
    break_lab,
    choose_node,
    find_scenario,
    heal_lab,
    open_lab,
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `lab` and its up, down and status subcommands."""
    lab = add_listed_command(
        subparsers, "lab", "Bring a local lab cluster up, report on it, or take it down."
    )
    commands = lab.add_subparsers(
        dest="lab_command",
        metavar="{up,down,status,break,heal,faults,kill,boot,driver-pools}",
        required=True,
    )

    up = _add_command(commands, "up", run_up, "build the node image if needed and start the lab")
    up.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="number of nodes (4)")
    up.add_argument(
        "--containerd",
        type=_series_list,
        default=DEFAULT_SERIES,
        help=f"containerd series per node, cycled: {','.join(DEFAULT_SERIES)} "
        f"(known: {', '.join(SERIES)})",
    )
    up.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help="GPUs per node (4)")
    up.add_argument(
        "--address-prefix",
        default=DEFAULT_ADDRESS_PREFIX,
        help=f"loopback /24 for node addresses ({DEFAULT_ADDRESS_PREFIX} gives .1, .2, ...)",
    )
    up.add_argument(
        "--endpoints",
        type=int,
        default=0,
        metavar="N",
        help="also N SSH endpoints, each with its own address, host key entry, inventory "
        "entry and Node object, served by the nodes in turn (their files, for planning at "
        "fleet scale)",
    )
    up.add_argument(
        "--endpoint-prefix",
        default=DEFAULT_ENDPOINT_PREFIX,
        help=f"loopback /16 (or /24) for endpoint addresses ({DEFAULT_ENDPOINT_PREFIX})",
    )
    up.add_argument(
        "--api-port",
        type=int,
        default=DEFAULT_API_PORT,
        help=f"control plane port ({DEFAULT_API_PORT}; another free one when taken)",
    )
    up.add_argument(
        "--no-controlplane",
        dest="controlplane",
        action="store_false",
        help="start the nodes only",
    )
    _add_fault_arguments(up)

    _add_command(commands, "down", run_down, "stop everything and delete the lab directory")
    _add_command(commands, "status", run_status, "show nodes and control plane")

    scenarios = "\n".join(f"  {s.name:<26} {s.summary}" for s in SCENARIOS)
    breaker = _add_command(
        commands,
        "break",
        run_break,
        "inject a failure for rehearsal (heal puts the lab back)",
        description="Inject one failure of the troubleshooting tree into the lab, for real "
        "(files on the node, containerd restarted, API objects), recording how to undo it.",
        epilog="scenarios:\n" + scenarios,
    )
    breaker.add_argument("scenario", metavar="SCENARIO", help="one of the scenarios below")
    breaker.add_argument("node", metavar="NODE", nargs="?", help="default: the first that suits")

    pools = _add_command(
        commands,
        "driver-pools",
        run_driver_pools,
        "manage the drivers by NVIDIADriver resources, one per pool of nodes",
        description="Label each pool's nodes, create one NVIDIADriver per pool at the "
        "ClusterPolicy's driver version, and set the ClusterPolicy's "
        "driver.useNvidiaDriverCRD: the operator then runs one driver DaemonSet per pool.",
    )
    pools.add_argument(
        "pools",
        metavar="POOL=NODE[,NODE...]",
        nargs="+",
        type=_pool,
        help="a pool (the NVIDIADriver's name) and its nodes",
    )

    heal = _add_command(commands, "heal", run_heal, "undo what `lab break` did (one node or all)")
    heal.add_argument("node", metavar="NODE", nargs="?", help="default: every node")

    faults = _add_command(
        commands,
        "faults",
        run_faults,
        "inject API and SSH faults into a running lab (or show what is injected)",
        description="Fault the lab on purpose, reproducibly: the API server answers 500, 503, "
        "429 with Retry-After, 409 on updates, resets connections, answers after the "
        "client's timeout or cuts watches; SSH sessions are cut mid-command, sshd refuses "
        "connections for a while, links are slow. Without SPEC: show the settings and the "
        "faults injected so far. Every fault is logged with its time and request in "
        "LAB_DIR/faults.log.",
        epilog="examples:\n  rollout lab faults api=0.2,ssh=0.1 --seed 7\n"
        "  rollout lab faults api-write=once,kinds=503\n  rollout lab faults off",
    )
    faults.add_argument("spec", metavar="SPEC", nargs="?", help=SPEC_HELP)
    faults.add_argument("--seed", type=int, default=0, help="the faults' seed (0)")

    kill = _add_command(
        commands,
        "kill",
        run_kill,
        "kill a node at once, as on a power cut (optionally boot it again)",
        description="Kill NODE's container at once (no shutdown: every process, sshd "
        "included, gets SIGKILL), logged in LAB_DIR/faults.log. With --boot-after, wait that "
        "long, boot it again and wait until containerd is active.",
    )
    kill.add_argument("node", metavar="NODE")
    kill.add_argument(
        "--boot-after", type=float, default=None, metavar="SECONDS", help="boot it again then"
    )

    boot = _add_command(commands, "boot", run_boot, "boot a killed node again")
    boot.add_argument("node", metavar="NODE")


def _add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    run: Callable[[argparse.Namespace], int],
    help: str,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A lab subcommand: its help, `--lab-dir` and `run` as its handler; an epilog is shown
    as written (it lists examples or scenarios, one a line)."""
    parser = add_command(
        commands, name, description, epilog, help=help, as_written=epilog is not None
    )
    _add_lab_dir(parser)
    parser.set_defaults(func=run)
    return parser


def run_up(args: argparse.Namespace) -> int:
    """Handler of `lab up`."""
    options = LabOptions(
        lab_dir=args.lab_dir,
        nodes=args.nodes,
        containerd=args.containerd,
        gpus=args.gpus,
        address_prefix=args.address_prefix,
        api_port=args.api_port,
        controlplane=args.controlplane,
        endpoints=args.endpoints,
        endpoint_prefix=args.endpoint_prefix,
    )
    settings = parse_fault_spec(args.faults, args.seed) if args.faults else None
    lab = bring_up_lab(options, progress=_progress)
    if settings is not None:
        write_settings(lab.lab_dir, settings)
        _progress(f"lab: injecting faults: {settings.describe()}")
    print(format_usage(lab))
    return 0


def run_faults(args: argparse.Namespace) -> int:
    """Handler of `lab faults`: set the running lab's faults, or show them."""
    lab_dir: Path = args.lab_dir
    if not (lab_dir / "lab.json").exists():
        raise BadInput(f"no lab at {lab_dir}; run `rollout lab up --lab-dir {lab_dir}` first")
    if args.spec is not None:
        settings = parse_fault_spec(args.spec, args.seed)
        write_settings(lab_dir, settings)
        print(f"faults: {settings.describe()}")
        return 0
    print(f"faults: {read_settings(lab_dir).describe()}")
    injected = read_fault_log(lab_dir)
    print(f"injected so far: {len(injected)} (log: {lab_dir / 'faults.log'})")
    for fault in injected[-10:]:
        print(f"  #{fault.id} {fault.at:%H:%M:%S.%f} {fault.where} {fault.fault}: {fault.request}")
    return 0


def run_kill(args: argparse.Namespace) -> int:
    """Handler of `lab kill`."""
    lab = Lab.from_lab_dir(args.lab_dir)
    kill_lab_node(lab, args.node)
    print(f"killed {args.node}")
    if args.boot_after is not None:
        boot_node_again(lab, args.node, after_s=args.boot_after)
        print(f"booted {args.node} again after {args.boot_after:g}s")
    return 0


def run_boot(args: argparse.Namespace) -> int:
    """Handler of `lab boot`."""
    boot_node_again(Lab.from_lab_dir(args.lab_dir), args.node)
    print(f"booted {args.node} again")
    return 0


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--faults", metavar="SPEC", default=None, help="inject faults once up: " + SPEC_HELP
    )
    parser.add_argument("--seed", type=int, default=0, help="the faults' seed (0)")


def run_down(args: argparse.Namespace) -> int:
    """Handler of `lab down`."""
    tear_down_lab(args.lab_dir, progress=_progress)
    return 0


def run_status(args: argparse.Namespace) -> int:
    """Handler of `lab status`; exits 1 when any part is not healthy."""
    status = read_lab_status(args.lab_dir)
    print(format_status(status))
    healthy = status.controlplane_up and all(
        n.running and n.ssh_ok and n.containerd_state == "active" for n in status.nodes
    )
    return 0 if healthy else 1


def run_break(args: argparse.Namespace) -> int:
    """Handler of `lab break`."""
    scenario = find_scenario(args.scenario)
    with open_lab(args.lab_dir) as access:
        node = choose_node(access.lab, scenario, args.node)
        break_lab(access, scenario, node)
    print(f"broke {node.name}: {scenario.name} ({scenario.summary})")
    print(f"  undo with: rollout lab heal {node.name} --lab-dir {access.lab.lab_dir}")
    return 0


def run_heal(args: argparse.Namespace) -> int:
    """Handler of `lab heal`."""
    with open_lab(args.lab_dir) as access:
        healed = heal_lab(access, args.node)
    if not healed:
        print("nothing to heal" + (f" on {args.node}" if args.node else ""))
    for entry in healed:
        print(f"healed {entry['node']}: {entry['scenario']}")
    return 0


def run_driver_pools(args: argparse.Namespace) -> int:
    """Handler of `lab driver-pools`."""
    pools = dict(args.pools)
    with open_lab(args.lab_dir) as access:
        split_driver_pools(access, pools)
    for name, nodes in pools.items():
        print(f"NVIDIADriver {name}: {', '.join(nodes)}")
    return 0


def _pool(text: str) -> tuple[str, tuple[str, ...]]:
    name, equals, nodes = text.partition("=")
    members = tuple(n.strip() for n in nodes.split(",") if n.strip())
    if not equals or not name.strip() or not members:
        raise argparse.ArgumentTypeError(f"{text!r}: use POOL=NODE[,NODE...]")
    return name.strip(), members


# each control plane warning `lab status` quotes is cut to this length
WARNING_CHARS = 300


def format_status(status: LabStatus) -> str:
    """The status table: one line per node, then the control plane."""
    rows = [("NODE", "ADDRESS", "RUNNING", "SSH", "CONTAINERD", "STATE")]
    for n in status.nodes:
        version = (
            n.containerd_version.split()[2] if n.containerd_version else f"({n.containerd_series})"
        )
        rows.append(
            (
                n.name,
                n.address,
                "yes" if n.running else "no",
                "ok" if n.ssh_ok else "-",
                version,
                n.containerd_state or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    plane = "up" if status.controlplane_up else "down"
    lines.append(f"control plane: {plane} ({status.api_url})")
    if status.controlplane_warnings:
        lines.append(f"  its latest warnings ({status.lab_dir / LOG_FILE}):")
        lines += [f"    {shorten(line, WARNING_CHARS)}" for line in status.controlplane_warnings]
    lines.append(f"lab dir: {status.lab_dir}")
    return "\n".join(lines)


def _add_lab_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lab-dir",
        type=Path,
        default=default_lab_dir(),
        help="the lab directory ($ROLLOUT_LAB_DIR, else /var/lib/rollout/lab)",
    )


def _series_list(text: str) -> tuple[str, ...]:
    series = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in series if s not in SERIES]
    if not series or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: use a comma list of {', '.join(SERIES)}")
    return series


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
