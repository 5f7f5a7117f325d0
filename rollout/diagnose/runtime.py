"""Runtime: what containerd loads on the node, against what the GPU Operator's pods need.

The handlers come from the node's own `containerd config dump` of its files (what the next
start loads) or, in recorded facts without a dump, from the merge model of its version.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rollout.containerd import (
    ContainerdConfigError,
    Unloaded,
    UnloadedKind,
    find_unloaded,
    merge_files,
)
from rollout.containerd.files import CONTAINERD_DIR
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.containerd.version import CRI_V2
from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.readings import file_handlers, is_gpu_node, modelled_handlers, q
from rollout.facts import ClusterFacts, NodeFacts

# the GPU Operator's RuntimeClass, assumed when the facts hold no RuntimeClasses
OPERATOR_HANDLER = "nvidia"
_SHOWN = 6


def check_runtime(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    """Every runtime finding of one node."""
    findings: list[Finding] = []
    config_error = _config_error(node)
    service = node.service
    if service is not None and not service.running:
        evidence = [f"containerd.service: {service.describe()}"]
        if config_error:
            evidence.append(config_error)
        evidence += [f"{what}: {why}" for what, why in node.probe_errors.items() if "dump" in what]
        findings.append(
            _finding(
                node,
                "runtime.containerd-down",
                f"containerd is not running on {node.name}"
                + (": its configuration does not load" if config_error else ""),
                tuple(evidence),
                f"ssh {q(node.name)} systemctl status containerd; "
                f"ssh {q(node.name)} journalctl -u containerd -n 50",
                Severity.ERROR,
            )
        )
    elif config_error:
        findings.append(
            _finding(
                node,
                "runtime.config-invalid",
                f"containerd on {node.name} will not start again: its configuration does not load",
                (config_error,),
                f"ssh {q(node.name)} containerd config dump",
                Severity.ERROR,
            )
        )
    if config_error:
        return findings
    findings += _unloaded(node)
    if is_gpu_node(node):
        findings += _handlers(node, cluster)
    findings += _changed_since_start(node)
    findings += _restarts(node)
    return findings


def _restarts(node: NodeFacts) -> list[Finding]:
    """Restarts by systemd and SIGHUPs (a restart too: containerd does not reload on HUP)."""
    restarts = node.service.n_restarts if node.service else None
    if not restarts and not node.service_journal:
        return []
    hups = sum("SIGHUP" in line for line in node.service_journal)
    return [
        _finding(
            node,
            "runtime.restarts",
            f"containerd on {node.name} was restarted by systemd {restarts or 0} time(s) since the "
            f"unit started; the journal shows {hups} SIGHUP(s) (a SIGHUP restarts containerd, "
            "it does not reload it)",
            (f"NRestarts={restarts}", *node.service_journal[-_SHOWN:]),
            f"ssh {q(node.name)} journalctl -u containerd --no-pager -n 50",
            Severity.INFO,
        )
    ]


def _config_error(node: NodeFacts) -> str:
    try:
        merge_files(node.config_files, node.containerd)
    except ContainerdConfigError as exc:
        where = exc.path or node.config_files.main_path
        return f"{where}" + (f":{exc.line}" if exc.line else "") + f": {exc.detail}"
    return ""


def _header_line(node: NodeFacts, path: str, plugin_id: str) -> str:
    text = node.config_files.files.get(path, "")
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("[plugins") and plugin_id in line:
            return f"{path}:{number}: {line.strip()}"
    return path


def _unloaded(node: NodeFacts) -> list[Finding]:
    """A finding per file whose settings containerd does not load (see containerd.unloaded):
    an error where a runtime handler is lost with them, a warning otherwise."""
    loaded, _ = _loaded_handlers(node)
    merged = merge_files(node.config_files, node.containerd)
    findings = []
    for u in find_unloaded(node.config_files, node.containerd):
        lost = [h for h in u.handlers if h not in loaded]
        severity = Severity.ERROR if lost else Severity.WARNING
        if u.shadowing is not None:
            findings.append(_shadowing(node, u, lost))
            continue
        ignored = u.kind is UnloadedKind.IGNORED_FOR_VERSION
        findings.append(
            _finding(
                node,
                "runtime.dropin-ignored" if ignored else "runtime.dropin-not-loaded",
                f"containerd {node.containerd.series} on {node.name} does not load "
                f"{'the version-2 CRI settings of ' if ignored else ''}{u.file}: {u.why}"
                + (f"; runtime handlers {', '.join(lost)} are lost" if lost else ""),
                (
                    _header_line(node, u.file, CRI_V2) if ignored else u.file,
                    f"not loaded: {u.shown()}",
                    f"load order: {', '.join(merged.load_order)}",
                    *merged.warnings,
                    f"to fix: {u.remedy}",
                ),
                f"ssh {q(node.name)} containerd config dump | grep -F {q(u.settings[0][-1])}"
                if ignored and u.settings
                else f"ssh {q(node.name)} containerd config dump | grep -A3 imports",
                severity,
            )
        )
    return findings


def _shadowing(node: NodeFacts, u: Unloaded, lost: list[str]) -> Finding:
    assert u.shadowing is not None
    s = u.shadowing
    evidence = (
        _header_line(node, s.shadowing_file, s.plugin_id),
        f"containerd {node.containerd.series}: {s.describe()}",
        f"to fix: {u.remedy}",
    )
    command = f"ssh {q(node.name)} containerd config dump | grep -A2 'runtimes\\.'"
    if lost:
        return _finding(
            node,
            "runtime.shadowing",
            f"{s.shadowing_file} replaces the whole CRI table of {s.shadowed_file} on "
            f"containerd {node.containerd.series}: runtime handlers {', '.join(lost)} are lost",
            evidence,
            command,
            Severity.ERROR,
        )
    return _finding(
        node,
        "runtime.shadowing-settings",
        f"{s.shadowing_file} hides settings of {s.shadowed_file} "
        f"({len(s.lost)} key(s)); no runtime handler is lost",
        evidence,
        command,
        Severity.WARNING,
    )


def _loaded_handlers(node: NodeFacts) -> tuple[set[str], str]:
    """The handlers containerd loads, and where that is read from."""
    if node.effective_config:
        loaded = set(list_runtime_handlers(node.effective_config))
        return loaded, "the node's containerd config dump"
    return modelled_handlers(node) or set(), "the merge model of its files"


def _handlers(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    toolkit = {
        h
        for path in node.config_files.files
        if path != node.config_files.main_path
        for h in file_handlers(node, path)
        if h.startswith("nvidia")
    }
    classes = (
        {OPERATOR_HANDLER}
        if cluster.runtime_classes is None
        else set(cluster.runtime_classes.values())
    )
    expected = toolkit | (classes & ({OPERATOR_HANDLER} | toolkit))
    loaded, source = _loaded_handlers(node)
    missing = sorted(expected - loaded)
    if not missing:
        return []
    why = (
        "no file under /etc/containerd defines them (the toolkit's drop-in is gone)"
        if not toolkit
        else "a file defines them, but containerd does not load them"
    )
    return [
        _finding(
            node,
            "runtime.handler-missing",
            f"containerd on {node.name} has no runtime handler {', '.join(missing)}: pods with "
            f"runtimeClassName {missing[0]} (the GPU Operator's operands) cannot start; {why}",
            (
                f"handlers loaded ({source}): {', '.join(sorted(loaded)) or 'none'}",
                f"handlers the toolkit drop-in defines: {', '.join(sorted(toolkit)) or 'none'}",
                "RuntimeClass handlers: "
                + (
                    "not read (the GPU Operator's nvidia assumed)"
                    if cluster.runtime_classes is None
                    else ", ".join(sorted(classes)) or "none"
                ),
            ),
            f"ssh {q(node.name)} containerd config dump | grep -c runtimes.nvidia",
            Severity.ERROR,
        )
    ]


def _changed_since_start(node: NodeFacts) -> list[Finding]:
    service = node.service
    if service is None or service.active_enter_at is None or not node.config_mtimes:
        return []
    started = service.active_enter_at
    changed = [
        (path, datetime.fromtimestamp(mtime, UTC))
        for path, mtime in node.config_mtimes.items()
        if datetime.fromtimestamp(mtime, UTC) > started
    ]
    if not changed:
        return []
    return [
        _finding(
            node,
            "runtime.files-changed",
            f"{len(changed)} file(s) under {CONTAINERD_DIR} changed since containerd started on "
            f"{node.name}: the next restart loads them",
            (
                f"containerd started {started.isoformat()}",
                *(f"{path} changed {when.isoformat()}" for path, when in changed[:_SHOWN]),
            ),
            f"ssh {q(node.name)} systemctl show containerd -p ActiveEnterTimestamp; "
            f"ssh {q(node.name)} ls -l --time-style=full-iso {CONTAINERD_DIR}",
            Severity.WARNING,
        )
    ]


def _finding(
    node: NodeFacts,
    check: str,
    cause: str,
    evidence: tuple[str, ...],
    command: str,
    severity: Severity,
) -> Finding:
    """A finding of the runtime branch about the whole node."""
    return Finding(node.name, None, Branch.RUNTIME, check, cause, evidence, command, severity)
