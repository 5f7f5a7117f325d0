"""`rollout schedule PLAN`: the manifests of a scheduled rollout, for `kubectl apply -f -`;
and, for `rollout apply` in the scheduled pod, where its run is kept (the cluster)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rollout.cli import add_listed_command
from rollout.errors import BadInput, ExitCode, RolloutError
from rollout.executor import RunReport
from rollout.inputs.inputfile import input_name, read_text
from rollout.playbook import load_playbooks
from rollout.run import STATE_DIR_ENV, RunOutcome
from rollout.run.cluster import ClusterRun, run_object_name
from rollout.transports.kube import EventType

if TYPE_CHECKING:
    from rollout.transports.kube import KubeClient
from rollout.savedplan import spec_text_of
from rollout.spec import parse_spec

HELP = """\
Print the Kubernetes objects that run PLAN on a schedule, inside the cluster: a CronJob
whose pod runs `rollout apply --yes`, a few nodes or waves per maintenance window, until
every node is done. Pipe it to `kubectl apply -f -`.

The objects, all named rollout-<plan name>:
  Namespace (unless --skip-namespace, or the namespace is a built-in one)
  ServiceAccount, and a ClusterRole, Roles and their bindings holding exactly the verbs on
    exactly the resources the plan's steps use (docs/permissions.md lists them per kind)
  ConfigMap with the plan and the inventory (a run reaches the nodes over SSH: its
    key_file and known_hosts point at the mounted SSH Secret)
  CronJob: concurrencyPolicy Forbid, startingDeadlineSeconds, timeZone, backoffLimit 0,
    activeDeadlineSeconds bounded by the window, the pinned --image, resources, a
    non-root user and a read-only root file system

The SSH key is never generated or embedded: create the Secret yourself (the YAML output's
first lines say how). The schedule defaults to the opening of the plan's
policy.maintenance_window, in the window's time zone.
"""

EPILOG = """\
examples (in the directory `rollout init` wrote; IMAGE is REPOSITORY@sha256:DIGEST):
  rollout schedule plan.yaml -i inventory/example.yaml --cron "0 22 * * fri" --image IMAGE \
      | kubectl apply -f -
  rollout schedule plan.yaml -i inventory/example.yaml --cron "0 22 * * fri" --image IMAGE \
      --suspend --output json

docs/schedule.md: the image (Containerfile), the Secret, and how runs continue window after
window.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "schedule", HELP, EPILOG, as_written=True)
    parser.add_argument(
        "plan_file", metavar="PLAN", type=Path, help="the plan.yaml (- reads standard input)"
    )
    parser.add_argument(
        "--inventory",
        "-i",
        metavar="FILE",
        type=Path,
        help="the nodes to reach over SSH (rollout YAML, Ansible INI or YAML); stored in the"
        " ConfigMap with key_file and known_hosts pointing at the SSH Secret",
    )
    parser.add_argument(
        "--image",
        required=True,
        help="the rollout image, pinned by digest (REPOSITORY@sha256:...); see docs/schedule.md",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        default="rollout",
        help="where the ServiceAccount, ConfigMap and CronJob live (default: rollout)",
    )
    parser.add_argument(
        "--skip-namespace",
        action="store_true",
        help="emit no Namespace object (the namespace exists already)",
    )
    parser.add_argument(
        "--cron",
        metavar="SCHEDULE",
        help="when runs start, five cron fields read in the window's time zone (default: the"
        " opening of the plan's maintenance window)",
    )
    parser.add_argument(
        "--suspend", action="store_true", help="create the CronJob suspended (spec.suspend)"
    )
    parser.add_argument(
        "--ssh-secret",
        metavar="NAME",
        help="the Secret with keys ssh-privatekey and known_hosts (default: rollout-<plan>-ssh)",
    )
    parser.add_argument(
        "--active-deadline",
        metavar="SECONDS",
        type=_seconds,
        help="a Job's time limit (default: the window's length plus one node's worst case;"
        " 4 hours without a window)",
    )
    parser.add_argument(
        "--output", "-o", choices=("yaml", "json"), default="yaml", help="yaml (default) or json"
    )
    parser.set_defaults(func=run_schedule)


def _seconds(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, found {text[:40]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 second, found {value}")
    return value


def run_schedule(args: argparse.Namespace) -> int:
    from rollout.inventory import load_inventory
    from rollout.schedule.manifests import ScheduleOptions, build_schedule

    # the text goes into the ConfigMap as written: comments and all
    plan_text = read_text(args.plan_file)
    # a saved plan (rollout plan --out) goes into the ConfigMap whole: the pod applies it
    spec = parse_spec(*spec_text_of(plan_text, input_name(args.plan_file)))
    inventory = load_inventory(args.inventory) if args.inventory is not None else None
    options = ScheduleOptions(
        image=args.image,
        namespace=args.namespace,
        create_namespace=not args.skip_namespace,
        cron=args.cron,
        suspend=args.suspend,
        ssh_secret=args.ssh_secret,
        active_deadline_s=args.active_deadline,
    )
    if inventory is not None and not inventory.hosts:
        raise BadInput(f"{args.inventory}: the inventory names no node")
    schedule = build_schedule(spec, plan_text, load_playbooks(), options, inventory)
    if args.output == "json":
        sys.stdout.write(json.dumps(schedule.to_list(), indent=2) + "\n")
        if schedule.ssh_secret is not None:
            print(
                f"note: create the Secret {schedule.ssh_secret} (keys ssh-privatekey,"
                f" known_hosts) in namespace {args.namespace}; rollout does not",
                file=sys.stderr,
            )
    else:
        sys.stdout.write(schedule.to_yaml())
    return ExitCode.OK


# --- the scheduled pod's run (rollout apply in a pod) ---------------------------------------


@dataclass(frozen=True)
class PodRunPlace:
    """A run in the scheduled CronJob's pod: kept in the cluster, in the pod's namespace."""

    namespace: str
    name: str  # the pod (its host name): part of the Lease holder's identity

    def where(self, plan_name: str) -> str:
        return f"secret {self.namespace}/{run_object_name(plan_name)}"

    def announce(self, kube: KubeClient, plan_name: str, run_id: str, report: RunReport) -> None:
        """An Event on the plan's ConfigMap saying how the run stopped (`kubectl describe
        configmap rollout-PLAN`, `kubectl get events`); a refused Event is said, not fatal."""
        left = sum(1 for outcome, _ in report.nodes.values() if outcome == "pending")
        if report.window_closed:
            kind, reason = EventType.NORMAL, "WindowClosed"
            message = f"window closed, {left} node(s) left: the next scheduled run continues"
        elif report.outcome is RunOutcome.SUCCEEDED:
            kind, reason, message = EventType.NORMAL, "RolloutDone", "every node done"
        else:
            kind, reason = EventType.WARNING, f"Run{report.outcome.value.capitalize()}"
            message = f"{report.outcome.value}: {report.halt_reason or 'see rollout status'}"
            message += f"; {left} node(s) left"
        configmap_name = f"rollout-{plan_name}"
        try:
            configmap = kube.get_configmap(self.namespace, configmap_name)
            involved = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": configmap_name,
                "namespace": self.namespace,
                "uid": configmap.uid or "",
            }
            kube.create_event_on(self.namespace, involved, reason, f"run {run_id}: {message}", kind)
        except RolloutError as exc:
            print(f"no Event on configmap {configmap_name}: {exc}", file=sys.stderr)


def pod_run_place(args: argparse.Namespace) -> PodRunPlace | None:
    """Where a run in a pod keeps its state: the cluster, unless a state directory is named
    (--state-dir, $ROLLOUT_STATE_DIR); None outside a pod (a run directory, as ever)."""
    if args.state_dir is not None or os.environ.get(STATE_DIR_ENV):
        return None
    # here, not at the top: it loads the kubernetes client, which `rollout plan` must not
    from rollout.transports.kube.incluster import pod_service_account

    account = pod_service_account(args.kubeconfig, args.context)
    if account is None:
        return None
    namespace = account.namespace
    if namespace is None:
        raise BadInput(
            f"{account.directory}/namespace is missing or empty: a pod's service account names"
            " its namespace there, where the run's state is kept; mount the account's files,"
            " or pass --state-dir DIR to keep the run in a directory"
        )
    return PodRunPlace(namespace, socket.gethostname())


def check_same_plan(found: ClusterRun, spec_text: str, plan_file: Path) -> None:
    """An unfinished run kept in the cluster continues only under the plan text it started
    with: a changed plan is refused, saying how to go on."""
    if found.invocation.spec_text == spec_text:
        return
    namespace, name = found.secret.namespace, found.secret.name
    finished = sum(1 for n in found.state.nodes if n.outcome is not None)
    raise BadInput(
        f"{plan_file} is not the plan that run {found.run_id} started with: {found.where} holds"
        f" that run, unfinished ({finished} node(s) finished), and the plan changed since."
        " Put the plan back as it was (the schedule's ConfigMap; the run's copy is the"
        f" spec_text of invocation.json in the Secret: kubectl get secret -n {namespace}"
        f" {name} -o jsonpath='{{.data.invocation\\.json}}' | base64 -d) and let the run"
        f" finish, or abandon it (kubectl delete secret -n {namespace} {name}; nodes it left"
        " cordoned stay cordoned, `rollout status` lists them first) and schedule the new plan"
    )


@contextlib.contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """SIGTERM stops a run as Ctrl-C does: the nodes in flight stop before their next step,
    the journal says where, the Lease is released. A pod gets SIGTERM when it is deleted or
    its Job passes activeDeadlineSeconds, and SIGKILL only after its grace period."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals (rollout run from a test's thread)
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
