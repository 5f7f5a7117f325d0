"""Recorded facts: a directory of node facts, read by `rollout plan --facts DIR`.

Recorded and live facts (rollout.facts.live) have one shape, so the planner never knows
which it plans from. The recorded texts go through the same parsers as the live commands'
output (`containerd_version` is the output of `containerd --version`).

Layout, one directory per node:

    <dir>/<node>/node.yaml           name, containerd --version output, labels, GPUs, ...
    <dir>/<node>/files/etc/containerd/config.toml
    <dir>/<node>/files/etc/containerd/conf.d/99-nvidia.toml
    <dir>/<node>/files/...           every other file containerd imports, and certs.d
    <dir>/cluster.yaml               optional: ConfigMaps and the ClusterPolicy

What diagnose reads besides is optional in both files (node.yaml: capacity, allocatable,
taints, the `systemctl show` text of containerd, the kernel log's Xid lines, `nvidia-smi -L`
with its exit code, the `nvidia-smi --query-remapped-rows` csv, file mtimes; cluster.yaml:
RuntimeClasses, pods and their events), so facts recorded for `plan` alone still load.

A facts directory is input like a plan, and as hostile: every problem is reported at once,
each naming the node and the file it was found in (with its line, where it has lines).
node.yaml is typed strictly (`ready: 'no'` is a string, not false); node names are
Kubernetes node names and appear once; recorded files are regular UTF-8 files of at most
MAX_FILE_BYTES, and a symlink is followed only to a regular file of the same node's
`files/` (a link out of it could carry any file of this machine into a plan); the
containerd config they form must load (valid TOML, imports that exist) on the node's version.
"""

from __future__ import annotations

import functools
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, Strict

from rollout.containerd import ConfigFiles, ContainerdConfigError, ContainerdVersion, merge_files
from rollout.containerd.files import DEFAULT_MAIN_PATH
from rollout.driver.host import driver_host_from_raw
from rollout.driver.status import parse_driver_kernel, parse_driver_status
from rollout.errors import InputError, InputErrors, RolloutError, SourceLocation
from rollout.fact import ProbeFailed
from rollout.facts.containerd import ContainerdVersionFact
from rollout.facts.gpu import GpuFacts
from rollout.facts.kernel import parse_xids
from rollout.facts.model import ClusterFacts, FleetFacts, NodeFacts, NodeFactsError
from rollout.facts.recorded_cluster import load_cluster_facts, strings, valid_name
from rollout.facts.recorded_files import (
    CONTROL_CHARACTERS,
    for_node,
    open_plain,
    read_open_text,
    read_recorded_files,
)
from rollout.facts.rowremap import parse_remapped_rows
from rollout.facts.service import ServiceState, parse_service_journal, parse_service_show
from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.fieldtypes import Bool, KubeName, SpecModel, Str
from rollout.inputs.inputfile import MAX_INPUT_BYTES
from rollout.inputs.yamlsource import SourceDocument
from rollout.transports.kube import Pod

NODE_FILE = "node.yaml"
CLUSTER_FILE = "cluster.yaml"
FILES_DIR = "files"


def _check_node_path(value: str) -> str:
    normal = value.startswith("/") and posixpath.normpath(value) == value
    if not normal or CONTROL_CHARACTERS.search(value):
        raise FieldProblem(
            f"expected an absolute, normalised path on the node, found {describe_value(value)}",
            hint="e.g. /etc/containerd/config.toml",
        )
    return value


NodePath = Annotated[str, Strict(), AfterValidator(_check_node_path)]


class GpuRecord(SpecModel):
    """`gpus:` of node.yaml, as `nvidia-smi --query-gpu` reported them."""

    count: Annotated[int, Strict(), Field(ge=0, le=1024)] | None = None
    product: Str = ""
    driver_version: Str = ""
    uuids: tuple[Str, ...] = ()
    device_ids: tuple[Str, ...] | None = None


class DriverHostRecord(SpecModel):
    """`driver_host:` of node.yaml: each host driver fact's raw output (the RAW_KEYS of
    rollout.driver.host)."""

    nvidia_smi: Str = ""
    kernel: Str = ""
    packages: Str = ""
    held: Str = ""
    apt: Str = ""
    secure_boot: Str = ""
    clients: Str = ""
    lsmod: Str = ""


class NodeRecord(SpecModel):
    """node.yaml: what `rollout facts record` writes of one node."""

    name: KubeName | None = None
    containerd_version: Str
    containerd_config: NodePath = DEFAULT_MAIN_PATH
    labels: Mapping[Str, Str | None] = Field(default_factory=dict)
    annotations: Mapping[Str, Str | None] = Field(default_factory=dict)
    unschedulable: Bool = False
    ready: Bool = True
    gpus: GpuRecord | None = None
    # for diagnose (rollout facts record writes them; see the module docstring)
    capacity: Mapping[Str, Str] = Field(default_factory=dict)
    allocatable: Mapping[Str, Str] = Field(default_factory=dict)
    taints: tuple[Str, ...] = ()
    service: Str | None = None
    kernel_log: Str = ""
    service_journal: Str = ""
    pod_logs: Mapping[Str, Str] = Field(default_factory=dict)
    nvidia_smi: Str | None = None
    remapped_rows: Str = ""
    driver_kernel: Str | None = None
    driver_host: DriverHostRecord | None = None
    # the pods bound to the node, as manifests the API transport's Pod reads (drain plans them)
    pods: tuple[Mapping[Str, Any], ...] = ()
    config_mtimes: Mapping[NodePath, Annotated[float, Strict()] | Annotated[int, Strict()]] = Field(
        default_factory=dict
    )


NODE_KEYS = frozenset(f.alias or n for n, f in NodeRecord.model_fields.items())


def load_recorded_facts(directory: Path) -> FleetFacts:
    """Read a recorded-facts directory (see the module docstring); InputErrors lists them all."""
    if not directory.is_dir():
        raise InputError(
            SourceLocation(str(directory)),
            "facts directory not found",
            hint="pass --facts DIR with one sub-directory per node holding node.yaml and files/",
        )
    with os.scandir(directory) as listing:  # directory entries: a fleet is 10,000 of them
        names = sorted(entry.name for entry in listing if _is_directory(entry))
    # paths as strings: a fleet is 10,000 nodes, and pathlib's joins cost more than their reads
    base = str(directory)
    held = False  # whether any sub-directory holds a node.yaml
    errors: list[InputError] = []
    nodes: list[NodeFacts] = []
    first_at: dict[str, str] = {}
    for name in names:
        node_dir = _child(base, name)
        source = _child(node_dir, NODE_FILE)
        try:  # one open where a look-up and a read were two
            text = read_open_text(open_plain(source), MAX_INPUT_BYTES)
        except FileNotFoundError:
            continue  # no node.yaml: not a node's directory
        except OSError:  # a link, a directory...: a node's, refused by read_text in its words
            if not os.path.lexists(source):
                continue
            text = None
        held = True
        try:
            node = _load_node(node_dir, name, text)
        except InputErrors as exc:
            errors.extend(exc.errors)
            continue
        except InputError as exc:
            errors.append(exc)
            continue
        if node.name in first_at:
            errors.append(
                NodeFactsError(
                    node.name,
                    SourceLocation(source),
                    "the node is recorded twice "
                    f"(first in {_child(first_at[node.name], NODE_FILE)})",
                    field="name",
                    hint="keep one directory per node; `name` defaults to the directory name",
                )
            )
            continue
        first_at[node.name] = node_dir
        nodes.append(node)
    if not held:
        raise InputError(
            SourceLocation(str(directory)),
            f"no node facts: no sub-directory holds a {NODE_FILE}",
            hint="each node's facts live in <dir>/<node>/node.yaml and <dir>/<node>/files/",
        )
    cluster = ClusterFacts()
    try:
        cluster = load_cluster_facts(directory / CLUSTER_FILE)
    except InputErrors as exc:
        errors.extend(exc.errors)
    except InputError as exc:
        errors.append(exc)
    if errors:
        raise InputErrors(errors)
    return FleetFacts(nodes=tuple(nodes), cluster=cluster, source=str(directory))


def _is_directory(entry: os.DirEntry[str]) -> bool:
    """A directory or a link to one (a node's directory, if it holds a node.yaml)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _child(directory: str, name: str) -> str:
    """str(Path(directory) / name) of a path pathlib wrote (`.`, `/`, or no trailing slash)."""
    if directory == ".":
        return name
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def _load_node(node_dir: str, dir_name: str, text: str | None) -> NodeFacts:
    """One node's recorded facts, of `node_dir` (named `dir_name`) whose node.yaml reads as
    `text` (None: read_text words why); InputErrors naming the node and each file."""
    source = _child(node_dir, NODE_FILE)
    fallback = dir_name
    try:
        if text is None:  # read_text words why
            doc = SourceDocument.from_path(Path(source))
        else:
            doc = SourceDocument.from_text(text, source)
        if not isinstance(doc.data, dict):
            raise InputError(
                doc.location_of(()),
                f"expected a mapping ({', '.join(sorted(NODE_KEYS))}), found "
                f"{describe_value(doc.data)}",
            )
        named = doc.data.get("name")
        if isinstance(named, str) and valid_name(named):
            fallback = named
        record = doc.validate(NodeRecord)
    except InputErrors as exc:
        raise InputErrors([for_node(fallback, e) for e in exc.errors]) from exc
    except InputError as exc:
        raise InputErrors([for_node(fallback, exc)]) from exc
    name = record.name or dir_name
    if record.name is None and not valid_name(name):
        raise NodeFactsError(
            name[:253],
            SourceLocation(source),
            f"the directory name {describe_value(name)} is not a Kubernetes node name",
            field="name",
            hint="add `name:` with the node's name as `kubectl get nodes` shows it",
        )
    try:
        containerd = _recorded_version(record.containerd_version)
    except RolloutError as exc:
        raise NodeFactsError(
            name, doc.location_of(("containerd_version",)), str(exc), field="containerd_version"
        ) from exc
    files_dir = _child(node_dir, FILES_DIR)
    files = read_recorded_files(files_dir, name)
    main_path = record.containerd_config
    if main_path not in files:
        raise NodeFactsError(
            name,
            doc.location_of(("containerd_config",), at_key=True),
            f"{main_path} is not among the recorded files",
            field="containerd_config",
            hint=f"record the node's files under {files_dir}{main_path}",
        )
    node = NodeFacts(
        name=name,
        containerd=containerd,
        config_files=ConfigFiles(main_path, files),
        labels=strings(record.labels),
        annotations=strings(record.annotations),
        unschedulable=record.unschedulable,
        ready=record.ready,
        gpus=_gpus(record.gpus),
        recorded_at=node_dir,
        taints=record.taints,
        capacity=dict(record.capacity),
        allocatable=dict(record.allocatable),
        service=_service(record.service, name, doc),
        xids=parse_xids(record.kernel_log),
        driver_status=None if record.nvidia_smi is None else parse_driver_status(record.nvidia_smi),
        config_mtimes={k: float(v) for k, v in record.config_mtimes.items()},
        remapped_rows=parse_remapped_rows(record.remapped_rows),
        pods=_bound_pods(record.pods, name, doc),
        service_journal=parse_service_journal(record.service_journal),
        pod_logs=dict(record.pod_logs),
        driver_kernel=None
        if record.driver_kernel is None
        else parse_driver_kernel(record.driver_kernel),
        driver_host=None
        if record.driver_host is None
        else driver_host_from_raw(record.driver_host.model_dump()),
    )
    try:
        merge_files(node.config_files, node.containerd)
    except ContainerdConfigError as exc:
        raise node.config_error(exc) from exc
    return node


@functools.lru_cache(maxsize=256)
def _recorded_version(text: str) -> ContainerdVersion:
    """`containerd --version` as recorded: a fleet records a few, each parsed once (a
    version is a value; a text that does not parse raises every time, nothing is kept)."""
    return ContainerdVersionFact().parse(text, "")


def _bound_pods(
    manifests: tuple[Mapping[str, Any], ...], node: str, doc: SourceDocument
) -> tuple[Pod, ...]:
    if not manifests:
        return ()
    pods = []
    for index, manifest in enumerate(manifests):
        try:
            pods.append(Pod.from_json(manifest))
        except (KeyError, TypeError, AttributeError) as exc:
            raise NodeFactsError(
                node,
                doc.location_of(("pods", index)),
                f"not a pod manifest (metadata.name, spec, status): {exc}",
                field="pods",
            ) from exc
    return tuple(pods)


def _service(text: str | None, node: str, doc: SourceDocument) -> ServiceState | None:
    if text is None:
        return None
    try:
        return parse_service_show(text)
    except ProbeFailed as exc:
        raise NodeFactsError(
            node, doc.location_of(("service",)), str(exc), field="service"
        ) from exc


def _gpus(record: GpuRecord | None) -> GpuFacts:
    if record is None:
        return GpuFacts(count=0)
    return GpuFacts(
        count=record.count if record.count is not None else len(record.uuids),
        product=record.product,
        uuids=record.uuids,
        driver_version=record.driver_version,
        device_ids=record.device_ids,
    )
