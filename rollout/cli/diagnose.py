"""`rollout diagnose`: the seed guide's symptom tree, walked over live or recorded facts."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from rollout.cli import add_listed_command
from rollout.cli.colors import add_color_options, chosen_color
from rollout.cli.documents import DOCUMENT_FORMATS, write_document
from rollout.cli.plan import add_fleet_arguments, connect_fleet, limit_of, limited_runners
from rollout.cli.render import make_console, md_code, md_fence, md_text, safe, show_controls
from rollout.diagnose import Diagnosis, Finding, Severity, diagnose, plan_remedies
from rollout.errors import BadInput, ExitCode
from rollout.facts import FleetFacts, load_recorded_facts
from rollout.facts.live import gather_diagnosis_facts
from rollout.limit import NodeLimit

HELP = """\
Walk the troubleshooting tree of a GPU node: is the GPU resource advertised (capacity,
allocatable, allocated; unhealthy devices with their Xids), does containerd load the
runtime handlers the GPU Operator needs (shadowing drop-ins per version, files changed
since it started), what the operator's labels say (upgrade-failed, paused operands, a
profile label naming a missing key, a driver/library mismatch), and why a GPU pod waits.
Each finding has its cause, the evidence and the read-only command that shows it.
Nothing is changed; --fix writes a plan.yaml for what rollout can repair.
"""

EPILOG = """\
exit codes: 0 healthy, 1 a finding is an error, 2 bad input.

examples (in the directory `rollout init` wrote):
  rollout diagnose --facts facts
  rollout diagnose gpu-a-3 --facts facts --output json
  rollout diagnose --facts facts --fix fix.yaml
  rollout plan fix.yaml --facts facts
  rollout diagnose -i LAB/inventory.yaml --kubeconfig LAB/kubeconfig --pod default/train-1
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "diagnose", HELP, EPILOG, as_written=True)
    parser.add_argument("nodes", metavar="NODE", nargs="*", help="nodes to check (default: all)")
    parser.add_argument("--pod", metavar="NS/NAME", help="also explain this pod")
    parser.add_argument(
        "--facts", metavar="DIR", type=Path, help="diagnose recorded facts (rollout facts record)"
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--output",
        "-o",
        choices=("text", "markdown", "json", "yaml"),
        default="text",
        help="format",
    )
    parser.add_argument(
        "--fix", metavar="PATH", type=Path, help="write a remediation plan.yaml to PATH"
    )
    add_color_options(parser)
    parser.set_defaults(func=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    if args.facts is not None and args.inventory is not None:
        raise BadInput("--facts and --inventory both name where facts come from; pass one")
    if args.pod is not None:
        namespace, slash, name = args.pod.partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise BadInput(f"--pod expects NAMESPACE/NAME, found {args.pod!r}")
    if args.fix is not None and args.fix.is_dir():
        raise BadInput(f"--fix {args.fix}: a directory; name the plan file to write")
    limit = limit_of(args)
    unreachable: dict[str, str] = {}
    if args.facts is not None:
        fleet = load_recorded_facts(args.facts)
    elif args.inventory is not None:
        fleet, unreachable = _gather(args, limit)
    else:
        raise BadInput(
            "where do the facts come from? pass --inventory FILE (with --kubeconfig) to probe "
            "the nodes, or --facts DIR for recorded facts"
        )
    nodes = tuple(args.nodes)
    if limit is not None:  # an unreachable node has no labels: its name decides
        known = [(n.name, n.labels) for n in fleet.nodes if not nodes or n.name in nodes]
        known += [(name, {}) for name in unreachable if not nodes or name in nodes]
        nodes = tuple(limit.select(known, fleet.source))
    diagnosis = diagnose(fleet, datetime.now(UTC), nodes, args.pod, unreachable=unreachable)
    if args.output in DOCUMENT_FORMATS:
        write_document(diagnosis.to_json(), args.output, sys.stdout)
    elif args.output == "markdown":
        sys.stdout.write(diagnosis_to_markdown(diagnosis))
    else:
        color = chosen_color(args)
        print_diagnosis_text(diagnosis, make_console(sys.stdout, color))
    if args.fix is not None:
        _write_fix(args.fix, diagnosis, fleet)
    return ExitCode.OK if diagnosis.healthy else ExitCode.FAILED


def _gather(args: argparse.Namespace, limit: NodeLimit | None) -> tuple[FleetFacts, dict[str, str]]:
    with connect_fleet(args) as connection:
        runners = connection.runners
        unknown = [n for n in args.nodes if n not in runners]
        if unknown:
            raise BadInput(f"node(s) {', '.join(unknown)} not in the inventory {args.inventory}")
        if args.nodes:
            runners = {n: r for n, r in runners.items() if n in args.nodes}
        runners = limited_runners(runners, limit, str(args.inventory))
        print(f"gathering facts from {len(runners)} node(s)", file=sys.stderr)
        return gather_diagnosis_facts(
            runners, connection.kube, max_parallel=args.parallel, source=str(args.inventory)
        )


def _write_fix(path: Path, diagnosis: Diagnosis, fleet: FleetFacts) -> None:
    remedies = plan_remedies(diagnosis, fleet)
    for finding, why in remedies.manual:
        where = finding.node or finding.pod or "cluster"
        print(f"needs a person: {show_controls(where)}: {finding.check}: {why}", file=sys.stderr)
    if remedies.plan is None:
        print("--fix: nothing rollout can repair; no plan written", file=sys.stderr)
        return
    path.write_text(remedies.to_yaml(), encoding="utf-8")
    print(
        f"--fix: wrote {show_controls(str(path))} ({len(remedies.repaired)} finding(s)); "
        f"review it with `rollout plan {show_controls(str(path))}`",
        file=sys.stderr,
    )


_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def print_diagnosis_text(diagnosis: Diagnosis, console: Console) -> None:
    """Findings as a terminal reads them: severity, where, cause, evidence, command."""
    verdict = "healthy" if diagnosis.healthy else "NOT healthy"
    flagged = _flagged_nodes(diagnosis)
    console.print(
        f"Diagnosis of {len(diagnosis.nodes)} node(s): {verdict}"
        + (f"; findings on {safe(', '.join(flagged))}" if flagged else "")
    )
    for finding in diagnosis.findings:
        style = _STYLE[finding.severity]
        console.print(
            f"\n[{style}]{finding.severity.value}[/{style}] {safe(_where(finding))} "
            f"{finding.branch.value} {safe(finding.check)}"
        )
        console.print(f"  {safe(finding.cause)}")
        for line in finding.evidence:
            console.print(f"    {safe(line)}")
        console.print(f"  see: {safe(finding.command)}")


def diagnosis_to_markdown(diagnosis: Diagnosis) -> str:
    verdict = "healthy" if diagnosis.healthy else "**not healthy**"
    flagged = _flagged_nodes(diagnosis)
    lines = [
        "# rollout diagnose",
        "",
        f"{len(diagnosis.nodes)} node(s) checked: {verdict}"
        + (f"; findings on {', '.join(md_code(n) for n in flagged)}" if flagged else ""),
        "",
    ]
    if diagnosis.findings:
        lines += ["| severity | where | check | cause |", "|---|---|---|---|"]
        lines += [
            f"| {f.severity.value} | {md_text(_where(f))} | {md_code(f.check)} "
            f"| {md_text(f.cause)} |"
            for f in diagnosis.findings
        ]
    for f in diagnosis.findings:
        lines += ["", f"## {f.severity.value}: {md_text(_where(f))} {md_code(f.check)}", ""]
        lines += [md_text(f.cause), ""]
        # fenced blocks: copied as they are (a code span in a table needs its | escaped)
        if f.evidence:
            lines += [md_fence("\n".join(f.evidence), "text"), ""]
        lines += ["see:", "", md_fence(f.command, "sh")]
    return "\n".join(lines) + "\n"


def _flagged_nodes(diagnosis: Diagnosis) -> list[str]:
    """The nodes with an error or a warning, in the order they were checked."""
    flagged = {f.node for f in diagnosis.findings if f.node and f.severity is not Severity.INFO}
    return [n for n in diagnosis.nodes if n in flagged] + sorted(flagged - set(diagnosis.nodes))


def _where(finding: Finding) -> str:
    if finding.pod and finding.node:
        return f"{finding.pod} on {finding.node}"
    return finding.pod or finding.node or "cluster"
