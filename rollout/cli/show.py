"""`rollout show FILE`: a saved plan rendered as `rollout plan` rendered it; and the saving
that `rollout plan --out FILE` does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.cli import add_listed_command
from rollout.cli.colors import add_color_options, chosen_color
from rollout.errors import ExitCode
from rollout.savedplan import make_saved_plan, read_saved_plan, write_saved_plan

if TYPE_CHECKING:
    from rollout.facts import FleetFacts
    from rollout.plan import Plan
    from rollout.schedule.forecast import Forecast

HELP = """\
Render a plan saved with `rollout plan PLAN --out FILE`: the waves, each node's steps, the
file diffs and the effective containerd diffs, as `rollout plan` showed them (credentials
are not in the file). The file is checked first: an edited, truncated or other-version
saved plan is refused (exit 2). `rollout apply FILE` runs exactly this plan.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "show", HELP, as_written=True)
    parser.add_argument("saved_file", metavar="FILE", type=Path, help="a saved plan")
    parser.add_argument(
        "--output",
        "-o",
        choices=("text", "markdown", "json", "yaml"),
        default="text",
        help="text for a terminal (default), markdown for a review comment, json or yaml for tools",
    )
    parser.add_argument(
        "--full", action="store_true", help="every node in full, not each group of them once"
    )
    add_color_options(parser)
    parser.set_defaults(func=run_show)


def save_plan(
    path: Path, plan: Plan, fleet: FleetFacts, spec: tuple[str, str], forecast: Forecast
) -> None:
    """`rollout plan --out FILE`: the plan shown, saved with what it was made from (`spec`:
    the plan's name in messages and the text planned)."""
    from rollout.schedule.forecast import forecast_lines

    shown = {"data": forecast.to_data(), "lines": forecast_lines(forecast)}
    saved = make_saved_plan(plan, fleet, *spec, shown)
    write_saved_plan(path, saved)
    print(f"plan saved to {path}: `rollout apply {path}` runs exactly it", file=sys.stderr)


def run_show(args: argparse.Namespace) -> int:
    from rollout.cli.documents import DOCUMENT_FORMATS, write_plan_document
    from rollout.cli.render import forecast_to_markdown, make_console, print_forecast
    from rollout.cli.render_groups import plan_markdown, print_plan

    saved = read_saved_plan(args.saved_file)
    lines = [str(line) for line in saved.forecast.get("lines", [])]
    data = saved.forecast.get("data")
    if args.output in DOCUMENT_FORMATS:
        forecast = data if isinstance(data, dict) else None
        write_plan_document(saved.plan, args.output, sys.stdout, forecast)
    elif args.output == "markdown":
        sys.stdout.write(plan_markdown(saved.plan, args.full) + forecast_to_markdown(lines))
    else:
        color = chosen_color(args)
        console = make_console(sys.stdout, color)
        print_plan(saved.plan, console, args.full)
        print_forecast(lines, console)
        console.print(
            f"saved by rollout {saved.tool_version}, checksum {saved.checksum}; "
            f"`rollout apply {args.saved_file}` runs exactly this plan"
        )
    return ExitCode.OK
