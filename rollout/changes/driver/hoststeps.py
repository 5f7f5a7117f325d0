"""The node side of a host-mode driver upgrade: stop and unload, install, reload, verify.

- `driver.unload`: stop nvidia-persistenced and nvidia-fabricmanager where they run; with
  `policy.driver.reload: modules` unload the nvidia modules, users first, after a reference
  count check (a module still held fails the node, or plans a reboot where
  `reboot_if_busy` allows it); with `reload: reboot` the modules stay loaded until the boot.
  Saved: `stopped` (units it stopped), `loaded_before` and `unloaded` (modules, in unload
  order), `reboot` (and `busy`, why, when a held module turned the reload into a reboot).
- `driver.install` (rollout.changes.driver.install) calls `install_packages`: apt-get install
  of each package at the pinned version, downgrades allowed, then apt-mark hold. Saved before apt
  runs: `previous` (each package's version, None when absent) and `held_before`. A failed
  install puts the previous versions back itself before it fails the node (the executor
  undoes only completed steps); its undo does the same after a later failure.
- `driver.reload`: modprobe the modules again, or reboot and prove it (a new boot_id, SSH,
  containerd active, the node Ready: rollout.changes.driver.reboot), then start the units it
  stopped. Saved: `before` (nvidia-smi before the reboot) and `reboot` (the boot ids).
- `driver.verify`: nvidia-smi reports the plan's version, with no library mismatch.

Undo order follows from the executor undoing completed steps in reverse: driver.resume's
undo pauses the operands again, driver.install's reinstalls and holds the previous
versions, driver.unload's makes the loaded module match the installed packages again
(reload or reboot) and restarts the units, driver.pause's puts the labels back.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from rollout.changes.base import PlanningContext
from rollout.changes.driver.hostplan import (
    DriverNotInstallable,
    HostDriverPlan,
    RebootDecision,
    host_change,
    plan_host_driver,
    plan_pending_host_driver,
)
from rollout.changes.driver.node import (
    DriverNodeError,
    ModulesBusy,
    apt_install,
    apt_mark,
    apt_remove,
    check_versions,
    load_modules,
    read_clients,
    read_driver,
    read_modules,
    read_packages,
    reload_missing,
    start_units,
    stop_units,
    unload_modules,
)
from rollout.changes.driver.reboot import describe_until_reboot, reboot_node
from rollout.driver.host import read_driver_host
from rollout.driver.modules import unload_order
from rollout.errors import RolloutError, TransientError
from rollout.facts import NodeFacts
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.spec.policy import DriverReload
from rollout.steps.base import StepContext, StepFailed, StepResult, translate_step_errors
from rollout.steps.nodemarks import report_step
from rollout.steps.traits import StepTraits, bounded_by_requests

UNLOAD_STEP = "driver.unload"
INSTALL_STEP = "driver.install"
RELOAD_STEP = "driver.reload"


def _guard(ctx: StepContext, kind: str, body: Callable[[StepContext], StepResult]) -> StepResult:
    """Run a step body: node errors fail the step, transient ones go to the retry policy."""

    def run(ctx: StepContext) -> StepResult:
        with translate_step_errors(ctx.node, kind):
            return body(ctx)

    return report_step(ctx, kind, run)


class HostDriverStep(abc.ABC):
    """A node step of a host-mode driver upgrade: skipped where the node's driver needs no
    change; applied through `_guard`."""

    kind: ClassVar[str]

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        planned = plan_pending_host_driver(self.kind, ctx, facts)
        if isinstance(planned, StepPlan):
            return planned
        return self.plan_change(planned, facts, ctx.spec)

    @abc.abstractmethod
    def plan_change(self, planned: HostDriverPlan, facts: NodeFacts, spec: Spec) -> StepPlan:
        """The plan where the node's driver changes."""

    def apply(self, ctx: StepContext) -> StepResult:
        return _guard(ctx, self.kind, self._apply)

    @abc.abstractmethod
    def _apply(self, ctx: StepContext) -> StepResult:
        """The step's work on the node."""


# ------------------------------------------------------------------ driver.unload


class DriverUnload(HostDriverStep):
    """Stop the GPU clients; unload the nvidia modules, or leave them for the reboot."""

    kind: ClassVar[str] = UNLOAD_STEP
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=grants_of("", "nodes", "get"),
        expected_s=5.0,
        worst_s=bounded_by_requests,
    )

    def plan_change(self, planned: HostDriverPlan, facts: NodeFacts, spec: Spec) -> StepPlan:
        host = facts.driver_host
        running = [u.unit for u in host.clients if u.active] if host else []
        stop = f"stop {', '.join(running)}; " if running else ""
        if spec.policy.driver.reload is DriverReload.REBOOT:
            return StepPlan.acting(self.kind, f"{stop}the modules stay loaded until the reboot")
        fallback = (
            "a module in use plans a reboot instead"
            if spec.policy.driver.reboot_if_busy
            else "a module in use fails the node"
        )
        return StepPlan.acting(
            self.kind, f"{stop}unload the nvidia modules, users first ({fallback})"
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        data = ctx.load_data(self.kind)
        if "stopped" not in data:
            running = [u.unit for u in read_clients(ctx.runner) if u.exists and u.active]
            data = {"stopped": running, "unloaded": [], "reboot": False}
            ctx.save_data(self.kind, data)  # before stopping: undo starts them again
        stopped = list(data["stopped"])
        stop_units(ctx.runner, stopped)
        said = f"stopped {', '.join(stopped)}; " if stopped else ""
        policy = ctx.spec.policy.driver
        if policy.reload is DriverReload.REBOOT or data.get("reboot"):
            ctx.save_data(self.kind, {**data, "reboot": True})
            return StepResult.done(f"{said}the modules stay loaded until the reboot")
        if "loaded_before" not in data:
            data = {**data, "loaded_before": unload_order(read_modules(ctx.runner))}
            ctx.save_data(self.kind, data)  # before rmmod: a failure loads them again
        try:
            unloaded = unload_modules(ctx.runner)
        except ModulesBusy as exc:
            if policy.reboot_if_busy:
                ctx.save_data(self.kind, {**data, "reboot": True, "busy": str(exc)})
                return StepResult.done(f"{said}{exc}: rebooting instead (reboot_if_busy)")
            raise self._fail_back(
                ctx,
                data,
                f"{exc}; policy.driver.reboot_if_busy is false, so the node fails "
                "rather than reboots",
            ) from exc
        except DriverNodeError as exc:
            raise self._fail_back(ctx, data, str(exc)) from exc
        # a resumed attempt finds them already unloaded: keep the first attempt's list
        order = unloaded or list(data.get("unloaded", []))
        ctx.save_data(self.kind, {**data, "unloaded": order})
        return StepResult.done(f"{said}unloaded {', '.join(order) or 'nothing (none loaded)'}")

    def _fail_back(self, ctx: StepContext, data: dict[str, Any], reason: str) -> StepFailed:
        """The step failed after stopping units: load what it unloaded, start the units
        again (the executor undoes completed steps only), then fail."""
        try:
            reload_missing(ctx.runner, list(data.get("loaded_before", [])))
            start_units(ctx.runner, list(data.get("stopped", [])))
        except RolloutError as exc:
            reason += f"; putting the modules and units back failed too: {exc}"
        else:
            reason += "; the modules and GPU clients are back as they were"
        return StepFailed(ctx.node, self.kind, reason)

    def undo(self, ctx: StepContext) -> None:
        """The loaded driver matches the installed packages again (modprobe, a reload or a
        reboot), then the stopped units start."""
        data = ctx.load_data(self.kind)
        if not data:
            return
        with translate_step_errors(ctx.node, self.kind, undo=True):
            self._undo(ctx, data)

    def _undo(self, ctx: StepContext, data: dict[str, Any]) -> None:
        stopped = list(data.get("stopped", []))
        stop_units(ctx.runner, stopped)  # driver.reload may have started them: they hold it
        driver = read_driver(ctx.runner)
        policy = ctx.spec.policy.driver
        if driver.mismatch:
            modules = policy.reload is DriverReload.MODULES and not data.get("reboot")
            try:
                if not modules:
                    raise ModulesBusy([])
                load_modules(ctx.runner, unload_modules(ctx.runner))
            except ModulesBusy:
                if policy.reload is DriverReload.MODULES and not policy.reboot_if_busy:
                    raise
                ctx.progress(
                    f"{ctx.node}: {self.kind}: undo: {reboot_node(ctx, self.kind, 'undo_reboot')}"
                )
        elif not driver.loaded:
            reload_missing(ctx.runner, list(data.get("loaded_before") or data.get("unloaded", [])))
        start_units(ctx.runner, stopped)
        after = read_driver(ctx.runner)
        if after.version is None:
            raise DriverNodeError(f"after putting the driver back: {after.describe()}")


# ------------------------------------------------------------------ driver.install (host)


def plan_install(ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
    """driver.install's plan in host mode."""
    planned = plan_pending_host_driver(INSTALL_STEP, ctx, facts)
    if isinstance(planned, StepPlan):
        return planned
    return StepPlan.acting(
        INSTALL_STEP,
        f"apt-get install {' '.join(planned.pins)} (driver {planned.current} -> "
        f"{planned.target}, kernel {planned.kernel}), then apt-mark hold",
        warnings=planned.warnings,
    )


def install_packages(ctx: StepContext) -> StepResult:
    """driver.install's apply in host mode."""
    return _guard(ctx, INSTALL_STEP, _install)


def _install(ctx: StepContext) -> StepResult:
    change = host_change(ctx.spec)
    assert change is not None
    names = change.apt_packages
    fresh = read_driver_host(ctx.runner, names, change.version)
    try:
        planned = plan_host_driver(ctx.spec, dataclasses.replace(ctx.facts, driver_host=fresh))
    except DriverNotInstallable as exc:
        raise StepFailed(ctx.node, INSTALL_STEP, exc.message) from exc
    assert planned is not None
    wanted = dict(planned.installs)
    data = ctx.load_data(INSTALL_STEP)
    if "previous" not in data:
        data = {
            "previous": {
                n: (p.version if (p := fresh.packages.get(n)) and p.present else None)
                for n in names
            },
            "held_before": [n for n in names if n in fresh.held],
            "target": wanted,
        }
        ctx.save_data(INSTALL_STEP, data)  # before apt runs: undo and a resume read it
    if all(
        (p := fresh.packages.get(n)) is not None and p.installed and p.version == v
        for n, v in wanted.items()
    ) and set(names) <= set(fresh.held):
        return StepResult.noop(f"{', '.join(planned.pins)} already installed and held")
    try:
        result = apt_install(ctx.runner, planned.pins)
        if not result.ok:
            raise DriverNodeError(
                f"`apt-get install {' '.join(planned.pins)}` exited {result.exit_code}:\n"
                + "\n".join(
                    f"    {line}"
                    for line in (result.stdout + result.stderr).strip().splitlines()[-12:]
                )
            )
        apt_mark(ctx.runner, "hold", names)
        check_versions(ctx.runner, wanted, "after apt-get install")
    except TransientError:
        raise  # the retry policy applies the step again: it reads what is installed first
    except RolloutError as failure:
        # the executor undoes completed steps only: this one puts back what it changed
        try:
            restored = restore_previous(ctx, data)
        except RolloutError as exc:
            raise StepFailed(
                ctx.node,
                INSTALL_STEP,
                f"{failure}\n  and putting the previous versions back failed too: {exc}",
            ) from exc
        raise StepFailed(
            ctx.node, INSTALL_STEP, f"{failure}\n  rolled back: {restored}"
        ) from failure
    previous = ", ".join(f"{n} {v or '(absent)'}" for n, v in data["previous"].items())
    return StepResult.done(f"installed and held {' '.join(planned.pins)} (was: {previous})")


def restore_previous(ctx: StepContext, data: dict[str, Any]) -> str:
    """Reinstall and hold the versions driver.install found; remove what it added."""
    previous: dict[str, str | None] = dict(data.get("previous") or {})
    pins = [f"{n}={v}" for n, v in previous.items() if v is not None]
    if pins:
        result = apt_install(ctx.runner, pins)
        if not result.ok:
            raise DriverNodeError(
                f"`apt-get install {' '.join(pins)}` exited {result.exit_code}: "
                + " / ".join(result.stdout.strip().splitlines()[-4:])
            )
    apt_remove(ctx.runner, [n for n, v in previous.items() if v is None])
    apt_mark(ctx.runner, "hold", [n for n, v in previous.items() if v is not None])
    check_versions(ctx.runner, previous, "after putting the previous versions back")
    return "reinstalled and held " + (" ".join(pins) or "nothing (none was installed)")


def undo_install(ctx: StepContext) -> None:
    """driver.install's undo in host mode: the previous versions back, held."""
    data = ctx.load_data(INSTALL_STEP)
    if "previous" not in data:
        return  # saved before apt ran: nothing was installed
    with translate_step_errors(ctx.node, INSTALL_STEP, undo=True):
        now = read_packages(ctx.runner, list(data["previous"]))
        if all(
            (p := now.get(n)) is not None and p.installed and p.version == v
            for n, v in data["previous"].items()
            if v is not None
        ) and not any(
            v is None and n in now and now[n].present for n, v in data["previous"].items()
        ):
            apt_mark(ctx.runner, "hold", [n for n, v in data["previous"].items() if v])
            return
        ctx.progress(f"{ctx.node}: {INSTALL_STEP}: undo: {restore_previous(ctx, data)}")


# ------------------------------------------------------------------ driver.reload


class DriverReloadStep(HostDriverStep):
    """Load the new driver: modprobe the unloaded modules, or reboot the node."""

    kind: ClassVar[str] = RELOAD_STEP
    # a reboot is waited for through the node's Ready condition
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=grants_of("", "nodes", "get"),
        expected_s=5.0,
        worst_s=bounded_by_requests,
    )

    def plan_change(self, planned: HostDriverPlan, facts: NodeFacts, spec: Spec) -> StepPlan:
        if planned.reboot == RebootDecision.YES:
            action = (
                "reboot (systemctl reboot); wait for a new boot_id, SSH, containerd and the "
                "node Ready"
            )
        elif planned.reboot == RebootDecision.IF_BUSY:
            action = "modprobe the new modules; reboot instead where a module stayed in use"
        else:
            action = "modprobe the new modules (no reboot)"
        return StepPlan.acting(self.kind, action + "; start the stopped GPU clients")

    def _apply(self, ctx: StepContext) -> StepResult:
        unload = ctx.load_data(UNLOAD_STEP)
        stopped = list(unload.get("stopped", []))
        if unload.get("reboot"):
            # what the node runs until the boot: new packages under the old module give the
            # library mismatch the reboot clears (recorded once, before the first request)
            data = ctx.load_data(self.kind)
            if "before" not in data:
                data = {**data, "before": describe_until_reboot(ctx)}
                ctx.save_data(self.kind, data)
            did = f"before the reboot {data['before']}; {reboot_node(ctx, self.kind, 'reboot')}"
        else:
            # every module loaded before that is missing now (a resumed attempt may find
            # some loaded already), nvidia first
            modules = list(unload.get("loaded_before") or unload.get("unloaded") or ["nvidia"])
            reload_missing(ctx.runner, modules)
            after = read_driver(ctx.runner)
            if after.version is None:
                raise DriverNodeError(f"after modprobe: {after.describe()}")
            did = f"loaded {', '.join(reversed(modules))}: {after.describe()}"
        start_units(ctx.runner, stopped)
        also = f"; started {', '.join(stopped)}" if stopped else ""
        return StepResult.done(did + also)

    def undo(self, ctx: StepContext) -> None:
        """Nothing by itself: driver.unload's undo reloads (or reboots into) the driver
        that driver.install's undo put back."""


# ------------------------------------------------------------------ driver.verify


class DriverVerify(HostDriverStep):
    """nvidia-smi on the node reports the plan's version, with no library mismatch."""

    kind: ClassVar[str] = "driver.verify"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(),
        expected_s=2.0,
        worst_s=bounded_by_requests,
    )

    def plan_change(self, planned: HostDriverPlan, facts: NodeFacts, spec: Spec) -> StepPlan:
        return StepPlan.acting(
            self.kind, f"nvidia-smi reports {planned.target}, no Driver/library version mismatch"
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        change = host_change(ctx.spec)
        assert change is not None
        driver = read_driver(ctx.runner)
        if driver.mismatch:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"{driver.describe()}: the old kernel module is still loaded; reload the "
                "modules or reboot the node",
            )
        if driver.version != change.version:
            raise StepFailed(
                ctx.node, self.kind, f"expected driver {change.version}; {driver.describe()}"
            )
        return StepResult.done(driver.describe())

    def undo(self, ctx: StepContext) -> None:
        """A check changes nothing."""
