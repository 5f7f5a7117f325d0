"""`rollout plan`: what would change, node by node, without touching anything."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollout.errors import BadInput, ExitCode
from rollout.facts import load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.spec import load_spec

HELP = """\
Show what `rollout apply` would do: the waves, each node's steps (or why a step is a
no-op), unified diffs of every file written, the EFFECTIVE containerd config diff (what
containerd will load, not just what the files say) and any drop-in that shadows another.
Nothing is changed.
"""

EPILOG = """\
facts:
  --facts DIR reads recorded facts: DIR/<node>/node.yaml (containerd --version output,
  labels, GPUs) and DIR/<node>/files/... (the node's /etc/containerd tree). See
  examples/facts for a mixed 1.6/1.7/2.1 fleet.

examples:
  rollout plan examples/plan.yaml --facts examples/facts
  rollout plan examples/plan.yaml --facts examples/facts --output markdown > plan.md
  rollout plan examples/plan.yaml --facts examples/facts --detailed-exitcode; echo $?
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show what would change (dry run)",
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("plan_file", metavar="PLAN", type=Path, help="the plan.yaml")
    parser.add_argument(
        "--facts",
        metavar="DIR",
        type=Path,
        help="plan from recorded node facts instead of probing the cluster",
    )
    parser.add_argument(
        "--output",
        "-o",
        choices=("text", "markdown", "json"),
        default="text",
        help="text for a terminal (default), markdown for a review comment, json for tools",
    )
    parser.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing would change, 2 when something would, 1 on error",
    )
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour text output"
    )
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    spec = load_spec(args.plan_file)
    if args.facts is None:
        raise BadInput(
            "live planning probes the cluster over SSH and the Kubernetes API, which this "
            "version does not do yet; pass --facts DIR with recorded node facts"
        )
    fleet = load_recorded_facts(args.facts)
    plan = build_plan(spec, str(args.plan_file), fleet, load_playbooks())
    if args.output == "json":
        sys.stdout.write(plan_to_json(plan))
    elif args.output == "markdown":
        sys.stdout.write(plan_to_markdown(plan))
    else:
        color = {"auto": None, "always": True, "never": False}[args.color]
        print_plan_text(plan, make_console(sys.stdout, color))
    if args.detailed_exitcode:
        # terraform's convention: 2 = changes pending, so CI can tell "plan is empty" apart
        return 2 if plan.has_changes else ExitCode.OK
    return ExitCode.OK
