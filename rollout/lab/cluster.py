"""The lab cluster: bring nodes and the control plane up, report on them, take them down.

The lab directory holds everything one lab is, so `down` can leave nothing behind:

    .rollout-lab          marker (and lock) written by `up`; `down` deletes only marked dirs
    lab.json              the contract with the control plane (api, nodes, roots)
    kubeconfig            http://127.0.0.1:<port>, context rollout-lab, no credentials
                          (the lab's administrator)
    kubeconfig-rollout    the same server, with the token of rollout's least-privilege
                          ServiceAccount (docs/permissions.md; valid while the control
                          plane that issued it runs)
    inventory.yaml        rollout's inventory of the nodes
    id_ed25519(.pub)      the key the nodes accept for root
    known_hosts           each node's own host key
    controlplane.log      output of `python -m rollout.lab.controlplane --lab-dir DIR`
    registry/, registry.log, registry.pid
                          the lab's image registry (rollout.lab.registry)
    nodes/<name>/         see rollout.lab.nodes

The control plane's process (launch, health, stop) is rollout.lab.controlplane_process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rollout.commands import check
from rollout.errors import BadInput, InputError, RolloutError
from rollout.lab.controlplane_process import (
    CONTROLPLANE_MODULE,
    ApiPortTaken,
    controlplane_answers,
    controlplane_available,
    launch_controlplane,
    read_controlplane_warnings,
    stop_controlplane,
)
from rollout.lab.description import LAB_FILE, EndpointDescription, GpuDescription, LabDescription
from rollout.lab.endpoints import (
    DEFAULT_ENDPOINT_PREFIX,
    endpoints_not_listening,
    plan_endpoints,
    write_endpoint_sshds,
)
from rollout.lab.image import INSTALLED_DRIVER, SERIES, NodeImage, build_image, find_image
from rollout.lab.mounts import mount_points_below
from rollout.lab.nodes import (
    NodeDirs,
    NodeSpec,
    NodeStatus,
    SshAccess,
    create_node,
    prepull_images,
    probe_node,
    read_node_pid,
    remove_node_dirs,
    start_node,
    stop_node,
    unmount_root,
    wait_node_ready,
    write_lab_mirror,
)
from rollout.lab.prerequisites import KUBELET_CRI, require_prerequisites
from rollout.lab.registry import registry_host, start_registry, stop_registry
from rollout.lab.registryimages import PREPULLED, build_images, push_images, served_namespaces
from rollout.lab.simulation.bootstrap import read_rbac_manifest
from rollout.transports.local import LocalRunner

DEFAULT_LAB_DIR = Path("/var/lib/rollout/lab")
LAB_DIR_ENV = "ROLLOUT_LAB_DIR"
DEFAULT_NODES = 4
DEFAULT_SERIES = ("1.6", "1.7", "2.1", "1.7")
DEFAULT_GPUS = 4
DEFAULT_ADDRESS_PREFIX = "127.0.1"
DEFAULT_API_PORT = 16443
API_HOST = "127.0.0.1"
DEVICE_PLUGIN_GRACE_S = 300  # kubelet's endpointStopGracePeriod (FACTS.md)
GPU_PRODUCT = "NVIDIA A100-SXM4-40GB"
GPU_MEMORY_MIB = 40960
CONTEXT = "rollout-lab"
# Automatic API ports are chosen free, then bound by another process: another may win.
PORT_ATTEMPTS = 3

MARKER = ".rollout-lab"
KUBECONFIG = "kubeconfig"
ROLLOUT_KUBECONFIG = "kubeconfig-rollout"
# The control plane forgets its tokens when it stops, so a long lifetime only covers the lab.
ROLLOUT_TOKEN_LIFETIME_S = 365 * 24 * 3600
INVENTORY = "inventory.yaml"
KEY_FILE = "id_ed25519"
KNOWN_HOSTS = "known_hosts"

Progress = Callable[[str], None]


class LabFailed(RolloutError):
    """The lab could not be brought up, inspected or taken down."""


@dataclass(frozen=True)
class LabOptions:
    """What `lab up` builds."""

    lab_dir: Path
    nodes: int = DEFAULT_NODES
    containerd: tuple[str, ...] = DEFAULT_SERIES
    gpus: int = DEFAULT_GPUS
    address_prefix: str = DEFAULT_ADDRESS_PREFIX
    api_port: int = DEFAULT_API_PORT
    device_plugin_grace_s: int = DEVICE_PLUGIN_GRACE_S
    controlplane: bool = True
    endpoints: int = 0
    endpoint_prefix: str = DEFAULT_ENDPOINT_PREFIX


@dataclass(frozen=True)
class Lab:
    """A lab as recorded in its directory."""

    lab_dir: Path
    api_host: str
    api_port: int
    device_plugin_grace_s: int
    nodes: tuple[NodeSpec, ...]
    endpoints: tuple[EndpointDescription, ...] = ()

    @property
    def kubeconfig(self) -> Path:
        return self.lab_dir / KUBECONFIG

    @property
    def rollout_kubeconfig(self) -> Path:
        """The least-privilege kubeconfig (rollout's ServiceAccount, docs/permissions.md)."""
        return self.lab_dir / ROLLOUT_KUBECONFIG

    @property
    def inventory(self) -> Path:
        return self.lab_dir / INVENTORY

    @property
    def ssh(self) -> SshAccess:
        return SshAccess(key_file=self.lab_dir / KEY_FILE, known_hosts=self.lab_dir / KNOWN_HOSTS)

    @property
    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    def node_dirs(self, node: NodeSpec) -> NodeDirs:
        return NodeDirs.from_lab_dir(self.lab_dir, node.name)

    def find_node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabFailed(f"no node {name!r} in the lab at {self.lab_dir}")

    def to_json(self) -> dict[str, Any]:
        """lab.json: the contract with the control plane."""
        return {
            "api": {"host": self.api_host, "port": self.api_port},
            "device_plugin_grace_s": self.device_plugin_grace_s,
            "nodes": [
                {
                    "name": n.name,
                    "address": n.address,
                    "containerd": n.containerd,
                    "gpus": [g.to_json() for g in n.gpus],
                    "driver_version": n.driver_version,
                    "root": str(self.node_dirs(n).root),
                }
                for n in self.nodes
            ],
            "endpoints": [
                {"name": e.name, "address": e.address, "node": e.node} for e in self.endpoints
            ],
        }

    @classmethod
    def from_lab_dir(cls, lab_dir: Path) -> Lab:
        """Read the lab recorded in lab_dir/lab.json."""
        path = lab_dir / LAB_FILE
        if not path.exists():
            raise LabFailed(f"no lab at {lab_dir} ({path} missing); run `rollout lab up`")
        try:
            description = LabDescription.from_file(path)
        except InputError as exc:
            raise LabFailed(f"{path} is not a lab description: {exc}") from exc
        nodes = tuple(
            NodeSpec(
                name=n.name,
                address=n.address,
                containerd=n.containerd,
                gpus=n.gpus,
                driver_version=n.driver_version,
                machine=_machine_name(lab_dir, n.name),
            )
            for n in description.nodes
        )
        return cls(
            lab_dir=lab_dir,
            api_host=description.api_host,
            api_port=description.api_port,
            device_plugin_grace_s=int(description.device_plugin_grace_s),
            nodes=nodes,
            endpoints=description.endpoints,
        )


@dataclass(frozen=True)
class LabStatus:
    """What `lab status` reports."""

    lab_dir: Path
    api_url: str
    controlplane_up: bool
    nodes: tuple[NodeStatus, ...]
    # the latest WARNING and ERROR lines of controlplane.log, oldest first
    controlplane_warnings: tuple[str, ...] = ()


def default_lab_dir() -> Path:
    """$ROLLOUT_LAB_DIR, else /var/lib/rollout/lab."""
    return Path(os.environ.get(LAB_DIR_ENV) or DEFAULT_LAB_DIR)


def plan_nodes(options: LabOptions) -> tuple[NodeSpec, ...]:
    """The nodes of a new lab: the containerd list cycles over the nodes."""
    if options.nodes < 1 or options.nodes > 250:
        raise BadInput(f"--nodes must be between 1 and 250, not {options.nodes}")
    if options.gpus < 0 or options.gpus > 16:
        raise BadInput(f"--gpus must be between 0 and 16, not {options.gpus}")
    if not options.containerd:
        raise BadInput("--containerd needs at least one series")
    unknown = [s for s in options.containerd if s not in SERIES]
    if unknown:
        raise BadInput(
            f"unknown containerd series {', '.join(unknown)}; known: {', '.join(SERIES)}"
        )
    octets = options.address_prefix.split(".")
    if (
        len(octets) != 3
        or octets[0] != "127"
        or not all(o.isdigit() and int(o) < 256 for o in octets)
    ):
        raise BadInput(
            "the address prefix must be three loopback octets like 127.0.1, "
            f"not {options.address_prefix!r}"
        )
    lab_dir = options.lab_dir.resolve()
    nodes = []
    for i in range(options.nodes):
        name = f"lab-node-{i + 1}"
        gpus = tuple(
            GpuDescription(
                index=g, product=GPU_PRODUCT, uuid=f"GPU-{uuid.uuid4()}", memory_mib=GPU_MEMORY_MIB
            )
            for g in range(options.gpus)
        )
        nodes.append(
            NodeSpec(
                name=name,
                address=f"{options.address_prefix}.{i + 1}",
                containerd=options.containerd[i % len(options.containerd)],
                gpus=gpus,
                driver_version=INSTALLED_DRIVER,
                machine=_machine_name(lab_dir, name),
            )
        )
    return tuple(nodes)


def bring_up_lab(options: LabOptions, progress: Progress = print) -> Lab:
    """Build (or reuse) the image, boot the nodes in parallel, start the control plane."""
    started = time.monotonic()
    specs = plan_nodes(options)  # bad arguments are bad input, whatever this machine has
    endpoints = plan_endpoints(options.endpoints, options.endpoint_prefix, [n.name for n in specs])
    # the kubelet's CRI client only serves the control plane's simulation
    require_prerequisites(SERIES, KUBELET_CRI if options.controlplane else None)
    lab_dir = options.lab_dir.resolve()
    _claim_lab_dir(lab_dir)
    with _lab_lock(lab_dir):
        if (lab_dir / LAB_FILE).exists():
            existing = Lab.from_lab_dir(lab_dir)
            if any(read_node_pid(n, existing.node_dirs(n)) for n in existing.nodes):
                raise LabFailed(
                    f"a lab is already up in {lab_dir}; run `rollout lab down --lab-dir {lab_dir}`"
                )
            progress(f"lab: clearing a stopped lab from {lab_dir}")
            _tear_down(existing, progress, remove_files=False)
        _check_addresses_free([n.address for n in specs] + [e.address for e in endpoints])
        image = find_image()
        if image is None:
            progress("lab: building the node image (once; cached afterwards)")
            image = build_image(progress)
        lab = Lab(
            lab_dir=lab_dir,
            api_host=API_HOST,
            api_port=_choose_port(options.api_port),
            device_plugin_grace_s=options.device_plugin_grace_s,
            nodes=specs,
            endpoints=endpoints,
        )
        try:
            lab = _start_lab(lab, image, options, progress)
        except BaseException:
            progress("lab: start failed; stopping what was started (logs stay in the lab dir)")
            _tear_down(lab, progress, remove_files=False)
            raise
    progress(f"lab: up in {time.monotonic() - started:.1f}s")
    return lab


def _start_lab(lab: Lab, image: NodeImage, options: LabOptions, progress: Progress) -> Lab:
    _write_json(lab.lab_dir / LAB_FILE, lab.to_json())
    public_key = _generate_client_key(lab.ssh.key_file)
    progress(f"lab: creating {len(lab.nodes)} nodes on overlays over {image.directory}")
    with ThreadPoolExecutor(max_workers=len(lab.nodes)) as pool:
        host_keys = list(
            pool.map(lambda n: create_node(n, image, lab.node_dirs(n), public_key), lab.nodes)
        )
    keys = {
        node.name: " ".join(key.split()[:2]) for node, key in zip(lab.nodes, host_keys, strict=True)
    }
    for node in lab.nodes:
        served = [e.address for e in lab.endpoints if e.node == node.name]
        if served:
            write_endpoint_sshds(lab.node_dirs(node).root, served)
    known_hosts = "".join(f"{node.address} {keys[node.name]}\n" for node in lab.nodes) + "".join(
        f"{e.address} {keys[e.node]}\n" for e in lab.endpoints
    )
    lab.ssh.known_hosts.write_text(known_hosts)
    _write_inventory(lab)
    _write_kubeconfig(lab)
    registry = registry_host(lab.nodes[0].address)
    for node in lab.nodes:
        write_lab_mirror(lab.node_dirs(node), registry, served_namespaces())
    progress("lab: booting nodes (systemd-nspawn --boot)")
    for node in lab.nodes:
        start_node(node, lab.node_dirs(node))
    # While the nodes boot: the registry, and the images they pull from it.
    start_registry(lab.lab_dir, registry, progress)
    push_images(registry, build_images(image.apt_archives))
    with ThreadPoolExecutor(max_workers=len(lab.nodes)) as pool:
        versions = list(
            pool.map(lambda n: wait_node_ready(n, lab.node_dirs(n), lab.ssh), lab.nodes)
        )
        list(pool.map(lambda n: prepull_images(n, lab.node_dirs(n), PREPULLED), lab.nodes))
    for node, version in zip(lab.nodes, versions, strict=True):
        progress(f"lab: {node.name} {node.address} ready: {version}")
    if lab.endpoints:
        closed = endpoints_not_listening(lab.endpoints)
        if closed:
            names = ", ".join(f"{e.name} ({e.address})" for e in closed[:5])
            raise LabFailed(f"{len(closed)} endpoint(s) not listening: {names}")
        first, last = lab.endpoints[0], lab.endpoints[-1]
        progress(
            f"lab: {len(lab.endpoints)} SSH endpoints listening, {first.name} {first.address} "
            f"to {last.name} {last.address}"
        )
    if not options.controlplane:
        return lab
    if not controlplane_available():
        progress(f"lab: {CONTROLPLANE_MODULE} is not available: nodes only, no Kubernetes API")
        return lab
    for _ in range(PORT_ATTEMPTS):
        try:
            launch_controlplane(lab.lab_dir, lab.api_url, progress)
            _write_rollout_kubeconfig(lab)
            return lab
        except ApiPortTaken:
            if options.api_port:
                raise  # the user asked for this port: say so rather than move
            # another process took the free port between choosing it and binding it
            lab = dataclasses.replace(lab, api_port=_choose_port(0))
            _write_json(lab.lab_dir / LAB_FILE, lab.to_json())
            _write_kubeconfig(lab)
            progress(f"lab: API port taken meanwhile; trying {lab.api_port}")
    raise LabFailed(f"no free API port after {PORT_ATTEMPTS} attempts")


def tear_down_lab(lab_dir: Path, progress: Progress = print) -> None:
    """Stop the control plane and every node, unmount, and delete the lab directory."""
    lab_dir = lab_dir.resolve()
    if not lab_dir.exists():
        progress(f"lab: nothing at {lab_dir}")
        return
    if not (lab_dir / MARKER).exists():
        raise LabFailed(f"{lab_dir} is not a lab directory (no {MARKER}); not touching it")
    with _lab_lock(lab_dir):
        if (lab_dir / LAB_FILE).exists():
            _tear_down(Lab.from_lab_dir(lab_dir), progress, remove_files=True)
        else:
            stop_controlplane(lab_dir, progress)
            stop_registry(lab_dir, progress)
            _unmount_strays(lab_dir)
    shutil.rmtree(lab_dir)
    progress(f"lab: removed {lab_dir}")


def _tear_down(lab: Lab, progress: Progress, *, remove_files: bool) -> None:
    stop_controlplane(lab.lab_dir, progress)
    stop_registry(lab.lab_dir, progress)

    def stop(node: NodeSpec) -> None:
        dirs = lab.node_dirs(node)
        stop_node(node, dirs)
        if remove_files:
            remove_node_dirs(node, dirs)

    with ThreadPoolExecutor(max_workers=max(1, len(lab.nodes))) as pool:
        list(pool.map(stop, lab.nodes))
    _unmount_strays(lab.lab_dir)
    progress(f"lab: stopped {len(lab.nodes)} nodes")


def read_lab_status(lab_dir: Path) -> LabStatus:
    """Each node's state (running, ssh, containerd) and whether the control plane answers."""
    lab = Lab.from_lab_dir(lab_dir.resolve())
    with ThreadPoolExecutor(max_workers=max(1, len(lab.nodes))) as pool:
        nodes = tuple(pool.map(lambda n: probe_node(n, lab.node_dirs(n), lab.ssh), lab.nodes))
    return LabStatus(
        lab_dir=lab.lab_dir,
        api_url=lab.api_url,
        controlplane_up=controlplane_answers(lab.api_url),
        nodes=nodes,
        controlplane_warnings=read_controlplane_warnings(lab.lab_dir),
    )


def format_usage(lab: Lab) -> str:
    """How to use a lab that is up: the lines `lab up` prints."""
    first = lab.nodes[0]
    ssh = (
        f"ssh -i {lab.ssh.key_file} -o UserKnownHostsFile={lab.ssh.known_hosts} "
        f"-o StrictHostKeyChecking=yes root@{first.address}"
    )
    nodes = ", ".join(f"{n.name} ({n.address}, containerd {n.containerd})" for n in lab.nodes)
    return "\n".join(
        [
            f"lab is up in {lab.lab_dir}",
            f"  nodes:      {nodes}",
            f"  api:        {lab.api_url}",
            f"  export KUBECONFIG={lab.kubeconfig}",
            f"  least privilege (docs/permissions.md): {lab.rollout_kubeconfig}",
            f"  inventory:  {lab.inventory}",
            f"  ssh:        {ssh}",
            f"  stop it:    rollout lab down --lab-dir {lab.lab_dir}",
        ]
    )


# --- lab directory ---------------------------------------------------------------------


def _claim_lab_dir(lab_dir: Path) -> None:
    """Make lab_dir ours: new or empty directories only, or one a previous `up` marked."""
    if lab_dir.exists() and not (lab_dir / MARKER).exists() and any(lab_dir.iterdir()):
        raise LabFailed(
            f"{lab_dir} exists, is not empty and is not a lab directory; "
            "choose another --lab-dir (lab down deletes the whole directory)"
        )
    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / MARKER).touch()


@contextlib.contextmanager
def _lab_lock(lab_dir: Path) -> Iterator[None]:
    with (lab_dir / MARKER).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise LabFailed(f"another `rollout lab` command is working on {lab_dir}") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _machine_name(lab_dir: Path, node: str) -> str:
    # nspawn keeps per-machine state under /run/systemd/nspawn: a lab-dir-derived suffix
    # keeps two labs on one host (a user's and the test suite's) apart.
    suffix = hashlib.sha256(str(lab_dir.resolve()).encode()).hexdigest()[:6]
    return f"{node}-{suffix}"


def _generate_client_key(key: Path) -> str:
    if not key.exists():
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rollout-lab", "-f", str(key)]
        check(LocalRunner().run(argv), "generating the lab's ssh key")
    return Path(str(key) + ".pub").read_text().strip()


def _write_inventory(lab: Lab) -> None:
    inventory = {
        "apiVersion": "rollout/v1",
        "kind": "Inventory",
        "defaults": {
            "user": "root",
            "port": 22,
            "key_file": str(lab.ssh.key_file),
            "become": False,
        },
        "nodes": [
            {"name": n.name, "address": n.address, "known_hosts": str(lab.ssh.known_hosts)}
            for n in lab.nodes
        ]
        + [
            {"name": e.name, "address": e.address, "known_hosts": str(lab.ssh.known_hosts)}
            for e in lab.endpoints
        ],
    }
    lab.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))


def _write_kubeconfig(lab: Lab) -> None:
    # Plain http without credentials: the official client sends no Authorization header
    # when the user entry is empty, and the emulator needs none.
    lab.kubeconfig.write_text(_kubeconfig_text(lab, CONTEXT, {}))


def _kubeconfig_text(lab: Lab, user: str, credentials: dict[str, str]) -> str:
    """A kubeconfig whose one context (rollout-lab, namespace default) is `user` on the lab."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": lab.api_url}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": user, "namespace": "default"},
            }
        ],
        "current-context": CONTEXT,
    }
    return yaml.safe_dump(kubeconfig, sort_keys=False)


def _write_rollout_kubeconfig(lab: Lab) -> None:
    """Ask the API for a token of rollout's ServiceAccount (TokenRequest, as `kubectl create
    token` does) and write a kubeconfig with it. Plain http: the official Python client
    sends the bearer token over http too (client-go, and so kubectl, does not)."""
    account = next(o for o in read_rbac_manifest() if o["kind"] == "ServiceAccount")
    namespace, name = account["metadata"]["namespace"], account["metadata"]["name"]
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": ROLLOUT_TOKEN_LIFETIME_S},
    }
    url = f"{lab.api_url}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10.0) as response:
            token = str(json.load(response)["status"]["token"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        raise LabFailed(f"no token for ServiceAccount {namespace}/{name}: {error}") from error
    path = lab.rollout_kubeconfig
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(_kubeconfig_text(lab, f"{CONTEXT}-{name}", {"token": token}))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.rename(path)


def _check_addresses_free(addresses: Sequence[str]) -> None:
    taken = []
    for address in addresses:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As sshd does: connections in TIME_WAIT from a previous lab do not block it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, 22))
            except OSError:
                taken.append(address)
    if taken:
        raise LabFailed(
            f"port 22 is taken on {', '.join(taken[:10])} (another lab, or an sshd on 0.0.0.0?); "
            "stop it or choose another --address-prefix or --endpoint-prefix"
        )


def _choose_port(wanted: int) -> int:
    """The wanted API port when it is free, else (or for 0) any free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server will: a previous lab's connections in TIME_WAIT do not block it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((API_HOST, wanted))
        except OSError:
            sock.bind((API_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _unmount_strays(lab_dir: Path) -> None:
    """Unmount anything still mounted below the lab dir (a crash between mount and record)."""
    for mount_point in reversed(mount_points_below(lab_dir)):
        unmount_root(mount_point, mount_point.parent.name)
