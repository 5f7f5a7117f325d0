"""`rollout schedule` output applied with real kubectl to the lab's API emulator, and the
generated role read back with `kubectl auth can-i` as the ServiceAccount sees it."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from rollout.cli import main
from rollout.inventory import load_inventory
from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.resources import CRONJOBS, EVENTS, JOBS, PODS
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.description import LabDescription
from rollout.lab.simulation.cronjobs import (
    SCHEDULED_ANNOTATION,
    CronJobController,
    JobController,
    ScaledClock,
)
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.timing import SimulationTimings
from rollout.playbook import load_playbooks
from rollout.schedule.manifests import ScheduleOptions, build_schedule
from rollout.schedule.permissions import Grant, schedule_grants
from rollout.spec import parse_spec
from tests.examples import edited_plan
from tests.lab.labapi import api_lab, apply_args, lab_kube_client
from tests.lab.test_kubectl import (  # noqa: F401 (fixtures)
    Kubectl,
    kubectl,
    kubectl_binary,
    registry,
    table,
)
from tests.unit.test_schedule import IMAGE, INVENTORY, plan_text

pytestmark = pytest.mark.lab

SA = "rollout-mirror"
NAMESPACES = ("default", "kube-system", "gpu-operator", "rollout")


@pytest.fixture()
def rollout_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """`rollout schedule` of the example plan: what it prints, given more options or none."""
    path = tmp_path / "plan.yaml"
    path.write_text(plan_text())

    def print_manifests(*extra: str) -> str:
        argv = ["schedule", str(path), "-i", str(INVENTORY), "--image", IMAGE, *extra]
        assert main(argv) == 0
        return capsys.readouterr().out

    return print_manifests


def test_the_schedule_applies_and_the_role_allows_exactly_the_steps(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    rollout_schedule: Callable[..., str],
) -> None:
    kubectl("create", "namespace", "gpu-operator")
    out = rollout_schedule()
    applied = kubectl("apply", "-f", "-", stdin=out).stdout.splitlines()
    assert applied == [
        "namespace/rollout created",
        f"serviceaccount/{SA} created",
        f"clusterrole.rbac.authorization.k8s.io/{SA} created",
        f"clusterrolebinding.rbac.authorization.k8s.io/{SA} created",
        f"role.rbac.authorization.k8s.io/{SA} created",
        f"rolebinding.rbac.authorization.k8s.io/{SA} created",
        f"role.rbac.authorization.k8s.io/{SA} created",
        f"rolebinding.rbac.authorization.k8s.io/{SA} created",
        f"role.rbac.authorization.k8s.io/{SA} created",
        f"rolebinding.rbac.authorization.k8s.io/{SA} created",
        f"configmap/{SA} created",
        f"cronjob.batch/{SA} created",
    ]
    # the same objects as JSON: nothing to change. kubectl validates a v1 List against the
    # OpenAPI v2 schemas, which the emulator does not serve: the items go as a JSON stream.
    listing = json.loads(rollout_schedule("--output", "json"))
    stream = "\n".join(json.dumps(item) for item in listing["items"])
    again = kubectl("apply", "-f", "-", stdin=stream).stdout.splitlines()
    assert all(line.endswith(" unchanged") for line in again), again
    stored = registry.get(CRONJOBS, "rollout", SA)
    spec = stored["spec"]
    assert (spec["concurrencyPolicy"], spec["timeZone"], spec["schedule"]) == (
        "Forbid",
        "Europe/Berlin",
        "0 22 * * 5,6",
    )
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    fetched = json.loads(kubectl("get", "cronjob", SA, "-n", "rollout", "-o", "json").stdout)
    assert fetched["spec"]["startingDeadlineSeconds"] == 4 * 3600

    token = kubectl("create", "token", SA, "-n", "rollout").stdout.strip()
    expected = schedule_grants(parse_spec(plan_text(), "plan.yaml"), load_playbooks(), "rollout")
    for namespace in NAMESPACES:
        listed = kubectl("--token", token, "auth", "can-i", "--list", "-n", namespace).stdout
        assert rules_of(listed) == expected_rules(expected, namespace), namespace
    for grant in expected:
        assert can_i(kubectl, token, grant) == "yes", grant.describe()
    # what the steps never do: each refused
    for verb, resource, namespace in (
        ("delete", "nodes", None),
        ("update", "configmaps", "gpu-operator"),
        ("create", "pods", "gpu-operator"),
        ("delete", "pods", "kube-system"),
        ("get", "secrets", "rollout"),  # only its run's, rollout-mirror-run
        ("update", "secrets/rollout-mirror-ssh", "rollout"),
        ("patch", "clusterpolicies.nvidia.com", None),
        ("update", "leases.coordination.k8s.io", "kube-system"),  # only the one named rollout
        ("create", "cronjobs.batch", "rollout"),
    ):
        args = ["--token", token, "auth", "can-i", verb, resource]
        args += ["-n", namespace] if namespace else []
        assert kubectl(*args, check=False).stdout == "no\n", (verb, resource, namespace)


def can_i(kubectl: Kubectl, token: str, grant: Grant) -> str:  # noqa: F811
    resource, _, sub = grant.resource.partition("/")
    target = f"{resource}.{grant.group}" if grant.group else resource
    if grant.name:
        target += f"/{grant.name}"
    args = ["--token", token, "auth", "can-i", grant.verb, target]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", grant.namespace] if grant.namespace else ["-A"] if target != "nodes" else []
    return str(kubectl(*args, check=False).stdout.strip())


RuleRow = tuple[str, str, tuple[str, ...]]


def rules_of(listing: str) -> set[RuleRow]:
    """(resource, resourceNames, verbs) rows of `kubectl auth can-i --list` for rollout's
    resources (leaving out what every authenticated user may do: reviews, discovery)."""
    rows: set[RuleRow] = set()
    for line in listing.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[[^\]]*\]\s+(\[[^\]]*\])\s+\[([^\]]*)\]$", line.strip())
        if match is None or match.group(1).endswith(
            (".authorization.k8s.io", ".authentication.k8s.io")
        ):
            continue
        resource, names, verbs = match.groups()
        rows.add((resource, names, tuple(sorted(verbs.split()))))
    return rows


def expected_rules(grants: tuple[Grant, ...], namespace: str) -> set[RuleRow]:
    rows: dict[tuple[str, str], set[str]] = {}
    for grant in grants:
        if grant.namespace not in (None, namespace):
            continue
        resource, _, sub = grant.resource.partition("/")
        shown = f"{resource}.{grant.group}" if grant.group else resource
        if sub:
            shown += f"/{sub}"
        names = f"[{grant.name}]" if grant.name else "[]"
        rows.setdefault((shown, names), set()).add(grant.verb)
    return {(r, n, tuple(sorted(v))) for (r, n), v in rows.items()}


def test_kubectl_prints_cronjobs_and_jobs_as_a_real_server_does(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    rollout_schedule: Callable[..., str],
) -> None:
    kubectl("apply", "-f", "-", stdin=rollout_schedule())
    (row,) = table(kubectl("get", "cronjobs", "-n", "rollout").stdout)
    assert row == {
        "NAME": SA,
        "SCHEDULE": "0 22 * * 5,6",
        "TIMEZONE": "Europe/Berlin",
        "SUSPEND": "False",
        "ACTIVE": "0",
        "LAST SCHEDULE": "<none>",
        "AGE": row["AGE"],
    }
    # a run now, as a user starts one from the CronJob (kubectl 1.36 sends it as protobuf)
    created = kubectl("create", "job", "by-hand", f"--from=cronjob/{SA}", "-n", "rollout")
    assert created.stdout == "job.batch/by-hand created\n"
    jobs = JobController(registry)
    jobs.reconcile()
    (job,) = table(kubectl("get", "jobs", "-n", "rollout").stdout)
    assert (job["NAME"], job["STATUS"], job["COMPLETIONS"]) == ("by-hand", "Running", "0/1")
    (pod,) = registry.list_objects(PODS, "rollout")
    assert pod["spec"]["serviceAccountName"] == SA
    registry.mutate(
        PODS,
        "rollout",
        pod["metadata"]["name"],
        lambda p: p.setdefault("status", {}).update(phase="Succeeded"),
    )
    jobs.reconcile()
    (job,) = table(kubectl("get", "jobs", "-n", "rollout", "-o", "wide").stdout)
    assert (job["STATUS"], job["COMPLETIONS"], job["IMAGES"]) == ("Complete", "1/1", IMAGE)


def test_the_emulator_refuses_what_the_real_server_refuses(
    kubectl: Kubectl,  # noqa: F811
    rollout_schedule: Callable[..., str],
) -> None:
    documents = list(yaml.safe_load_all(rollout_schedule()))
    cronjob = documents[-1]
    cronjob["metadata"]["namespace"] = "default"
    cronjob["spec"]["schedule"] = "61 22 * * *"
    cronjob["spec"]["timeZone"] = "Mars/Olympus"
    cronjob["spec"]["concurrencyPolicy"] = "Sometimes"
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    refused = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cronjob), check=False)
    assert refused.returncode == 1
    for field in (
        "spec.schedule",
        "spec.timeZone",
        "spec.concurrencyPolicy",
        "spec.jobTemplate.spec.template.spec.restartPolicy",
    ):
        assert field in refused.stderr, (field, refused.stderr)


# --- the lab's CronJob and Job controllers ------------------------------------------------


class FakeClock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self, at: datetime) -> None:
        self.now = at.timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, at: datetime) -> None:
        self.now = at.timestamp()


def cluster_at(
    at: datetime, *extra: str
) -> tuple[Registry, FakeClock, CronJobController, JobController]:
    """A api holding the objects of `rollout schedule` for the windowed plan, created at
    `at`, and the two controllers on the same clock."""
    clock = FakeClock(at)
    api = Registry(clock=clock)
    # a cron schedule stands alone: no window, so startingDeadlineSeconds is 300
    text = plan_text(window=not any(f.startswith("cron=") for f in extra))
    options: dict[str, Any] = {}
    for flag in extra:
        key, _, value = flag.partition("=")
        options[key] = value if key == "cron" else int(value)
    built = build_schedule(
        parse_spec(text, "plan.yaml"),
        text,
        load_playbooks(),
        ScheduleOptions(image=IMAGE, **options),
        load_inventory(INVENTORY),
    )
    for obj in built.objects:
        kind = api.catalog.find_kind(*_group_version(obj["apiVersion"]), _resource(obj["kind"]))
        assert kind is not None
        api.create(kind, obj["metadata"].get("namespace"), obj)
    return api, clock, CronJobController(api, clock), JobController(api, clock)


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _resource(kind: str) -> str:
    return {"ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings"}.get(
        kind, kind.lower() + "s"
    )


def tick(cronjobs: CronJobController, jobs: JobController) -> None:
    jobs.reconcile()
    cronjobs.reconcile()
    jobs.reconcile()


def owned_jobs(api: Registry) -> list[dict[str, Any]]:
    return sorted(api.list_objects(JOBS, "rollout"), key=lambda j: j["metadata"]["name"])


def set_phase(api: Registry, pod: Mapping[str, Any], phase: str) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["phase"] = phase

    api.mutate(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], change)


def reasons(api: Registry, involved: str) -> list[str]:
    return [
        e["reason"]
        for e in api.list_objects(EVENTS, "rollout")
        if e["involvedObject"]["name"] == involved
    ]


def conditions(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(c["type"], c.get("reason", "")) for c in job["status"].get("conditions", [])]


BERLIN = ZoneInfo("Europe/Berlin")


def test_the_cronjob_fires_when_the_window_opens_in_its_time_zone() -> None:
    # Thursday 2024-01-04; the window opens Fridays and Saturdays at 22:00 Berlin (21:00 UTC)
    api, clock, cronjobs, jobs = cluster_at(datetime(2024, 1, 4, 12, tzinfo=UTC))
    tick(cronjobs, jobs)
    assert owned_jobs(api) == []
    clock.set(datetime(2024, 1, 5, 21, 59, tzinfo=BERLIN))
    tick(cronjobs, jobs)
    assert owned_jobs(api) == []
    clock.set(datetime(2024, 1, 5, 22, 0, 20, tzinfo=BERLIN))
    tick(cronjobs, jobs)
    (job,) = owned_jobs(api)
    opened = datetime(2024, 1, 5, 21, tzinfo=UTC)
    assert job["metadata"]["name"] == f"{SA}-{int(opened.timestamp() // 60)}"
    assert job["metadata"]["annotations"][SCHEDULED_ANNOTATION] == "2024-01-05T22:00:00+01:00"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    assert job["spec"]["backoffLimit"] == 0
    cronjob = api.get(CRONJOBS, "rollout", SA)
    assert cronjob["status"]["lastScheduleTime"] == "2024-01-05T21:00:00Z"
    assert [a["name"] for a in cronjob["status"]["active"]] == [job["metadata"]["name"]]
    assert "SuccessfulCreate" in reasons(api, SA)
    (pod,) = api.list_objects(PODS, "rollout")
    # in the controllers' own words
    said = {
        (e["involvedObject"]["name"], e["message"]) for e in api.list_objects(EVENTS, "rollout")
    }
    assert (SA, f"Created job {job['metadata']['name']}") in said
    assert (job["metadata"]["name"], f"Created pod: {pod['metadata']['name']}") in said
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job["metadata"]["name"]
    assert pod["spec"]["serviceAccountName"] == SA
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    # in summer Berlin is UTC+2: the same schedule fires at 20:00 UTC
    api, clock, cronjobs, jobs = cluster_at(datetime(2024, 7, 5, 12, tzinfo=UTC))
    clock.set(datetime(2024, 7, 5, 20, 0, 30, tzinfo=UTC))
    tick(cronjobs, jobs)
    assert len(owned_jobs(api)) == 1


def test_forbid_skips_a_run_while_one_is_active_and_a_late_start_is_missed() -> None:
    start = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)
    api, clock, cronjobs, jobs = cluster_at(start, "cron=*/10 * * * *")
    clock.set(start + timedelta(minutes=10))
    tick(cronjobs, jobs)
    (first,) = owned_jobs(api)
    (pod,) = api.list_objects(PODS, "rollout")
    set_phase(api, pod, "Running")
    clock.set(start + timedelta(minutes=20))
    tick(cronjobs, jobs)
    assert owned_jobs(api) == [api.get(JOBS, "rollout", first["metadata"]["name"])]
    assert "JobAlreadyActive" in reasons(api, SA)
    set_phase(api, pod, "Succeeded")
    # 12:20 went unmet; at 12:26 it is older than startingDeadlineSeconds (300 without a
    # window): the controller no longer looks that far back, and starts nothing
    clock.set(start + timedelta(minutes=26))
    tick(cronjobs, jobs)
    (done,) = owned_jobs(api)
    assert conditions(done) == [("Complete", "")]
    cronjob = api.get(CRONJOBS, "rollout", SA)
    assert "active" not in cronjob["status"] and cronjob["status"]["lastSuccessfulTime"]
    clock.set(start + timedelta(minutes=30))
    tick(cronjobs, jobs)
    assert len(owned_jobs(api)) == 2  # the next schedule runs


def at_first_run() -> tuple[Registry, CronJobController, JobController, dict[str, Any]]:
    """A CronJob every 10 minutes, its clock at the first run: the cluster and that run's pod."""
    start = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)
    api, clock, cronjobs, jobs = cluster_at(start, "cron=*/10 * * * *")
    clock.set(start + timedelta(minutes=10))
    tick(cronjobs, jobs)
    (pod,) = api.list_objects(PODS, "rollout")
    return api, cronjobs, jobs, pod


def test_backoff_limit_zero_fails_the_job_at_the_first_failed_pod() -> None:
    api, cronjobs, jobs, pod = at_first_run()
    set_phase(api, pod, "Failed")
    tick(cronjobs, jobs)
    (job,) = owned_jobs(api)
    assert conditions(job) == [("Failed", "BackoffLimitExceeded")]
    assert len(api.list_objects(PODS, "rollout")) == 1  # no second pod


def test_a_pod_deleted_before_it_ended_counts_as_failed() -> None:
    api, cronjobs, jobs, pod = at_first_run()
    set_phase(api, pod, "Running")
    tick(cronjobs, jobs)
    api.delete(PODS, "rollout", pod["metadata"]["name"])
    tick(cronjobs, jobs)
    (job,) = owned_jobs(api)
    assert conditions(job) == [("Failed", "BackoffLimitExceeded")]
    assert api.list_objects(PODS, "rollout") == []  # not replaced: backoffLimit 0


def test_active_deadline_stops_the_job_and_its_pod() -> None:
    start = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)
    api, clock, cronjobs, jobs = cluster_at(start, "cron=*/10 * * * *", "active_deadline_s=120")
    clock.set(start + timedelta(minutes=10))
    tick(cronjobs, jobs)
    (pod,) = api.list_objects(PODS, "rollout")
    set_phase(api, pod, "Running")
    clock.set(start + timedelta(minutes=11))
    tick(cronjobs, jobs)
    assert conditions(owned_jobs(api)[0]) == []
    clock.set(start + timedelta(minutes=12, seconds=1))
    tick(cronjobs, jobs)
    assert conditions(owned_jobs(api)[0]) == [("Failed", "DeadlineExceeded")]
    assert api.list_objects(PODS, "rollout") == []


def test_a_suspended_cronjob_starts_nothing_and_history_is_bounded() -> None:
    start = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)
    api, clock, cronjobs, jobs = cluster_at(start, "cron=*/10 * * * *")

    def suspend(value: bool) -> None:
        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["suspend"] = value

        api.mutate(CRONJOBS, "rollout", SA, change)

    suspend(True)
    clock.set(start + timedelta(minutes=10))
    tick(cronjobs, jobs)
    assert owned_jobs(api) == []
    suspend(False)
    for run in range(5):  # five runs, each succeeding: 3 kept (successfulJobsHistoryLimit)
        clock.set(start + timedelta(minutes=10 * (run + 2)))
        tick(cronjobs, jobs)
        for pod in api.list_objects(PODS, "rollout"):
            set_phase(api, pod, "Succeeded")
        tick(cronjobs, jobs)
    tick(cronjobs, jobs)
    kept = owned_jobs(api)
    assert len(kept) == 3 and all(conditions(j) == [("Complete", "")] for j in kept)


def test_the_scaled_clock_is_ahead_and_faster() -> None:
    clock = ScaledClock(offset_s=3600, scale=60)
    first = clock()
    assert first - time.time() > 3500
    time.sleep(0.05)
    assert clock() - first >= 60 * 0.05 * 0.9


def test_the_lab_simulation_runs_the_controllers_on_its_clock() -> None:
    """The lab's tick (rollout.lab.simulation.engine) creates the Job and its pod."""
    start = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)
    api, clock, _, _ = cluster_at(start, "cron=*/10 * * * *")
    simulation = Simulation(
        api,
        LabDescription(nodes=()),
        probe=None,
        timings=SimulationTimings(),
        clock=clock,  # type: ignore[arg-type]
    )
    simulation.step()
    assert owned_jobs(api) == []
    clock.set(start + timedelta(minutes=10))
    simulation.step()
    (job,) = owned_jobs(api)
    (pod,) = api.list_objects(PODS, "rollout")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]


# --- the generated role on the shared lab ---------------------------------------------------


@pytest.fixture(scope="module")
def shared(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


def lab_kubectl(lab: Lab, home: Path, *args: str, stdin: str | None = None) -> str:
    """Real kubectl on the lab's administrator kubeconfig (plain http, no credentials)."""
    done = subprocess.run(
        [str(kubectl_binary()), "--kubeconfig", str(lab.kubeconfig), *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def test_the_generated_role_less_one_verb_fails_the_run_naming_it(
    shared: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run under the schedule's ServiceAccount, its ClusterRole without `patch` on nodes:
    the first node's cordon is refused with a 403 that names the verb, and nothing changes."""
    # a mirror no test has written, so every node has work to do
    plan = edited_plan(tmp_path, "mirror.registry.internal:5000", "schedule.registry.internal:5000")
    text = plan.read_text()
    spec = parse_spec(text, str(plan))
    namespace = "rollout-schedule-test"
    built = build_schedule(
        spec,
        text,
        load_playbooks(),
        ScheduleOptions(image=IMAGE, namespace=namespace, cron="0 3 * * *", suspend=True),
        load_inventory(shared.inventory),
    )
    objects = [json.loads(json.dumps(o)) for o in built.objects]
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    nodes_rule = next(r for r in role["rules"] if r["resources"] == ["nodes"])
    nodes_rule["verbs"].remove("patch")
    manifest = yaml.safe_dump_all(objects)
    account = f"rollout-{spec.metadata.name}"
    lab_kubectl(shared, tmp_path, "apply", "-f", "-", stdin=manifest)
    try:
        token = lab_kubectl(shared, tmp_path, "create", "token", account, "-n", namespace).strip()
        kubeconfig = tmp_path / "kubeconfig-schedule"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": CONTEXT, "cluster": {"server": shared.api_url}}],
                    "users": [{"name": account, "user": {"token": token}}],
                    "contexts": [
                        {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": account}}
                    ],
                    "current-context": CONTEXT,
                }
            )
        )
        capsys.readouterr()
        assert main(apply_args(shared, plan, tmp_path / "state", kubeconfig)) == 1
        out = capsys.readouterr()
        said = out.out + out.err
        assert (
            f'User "system:serviceaccount:{namespace}:{account}" cannot patch resource "nodes"'
            in said
        ), said
        assert "`patch` on `nodes`" in said, said
    finally:
        lab_kubectl(
            shared,
            tmp_path,
            "delete",
            "-f",
            "-",
            "--wait=false",
            "--ignore-not-found",
            stdin=manifest,
        )
    with lab_kube_client(shared) as kube:
        for node in shared.nodes:
            assert not kube.get_node(node.name).unschedulable, node.name
