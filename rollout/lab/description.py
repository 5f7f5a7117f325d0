"""The lab description, `<lab-dir>/lab.json`: written by `rollout lab up`, read by the lab
itself and by the control plane (the contract between the two)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import InputError, SourceLocation

LAB_FILE = "lab.json"
# On an endpoint's Node object: the name of the lab node it stands for.
ENDPOINT_ANNOTATION = "lab.rollout/endpoint-of"
DEFAULT_API_PORT = 16443
DEFAULT_DEVICE_PLUGIN_GRACE_S = 300.0


# The PCI device id (device << 16 | vendor, as `nvidia-smi --query-gpu=pci.device_id` prints
# it) of each GPU product the lab can describe; mig-parted's device-filter selects by it.
PCI_DEVICE_IDS = {
    "NVIDIA A100-SXM4-40GB": "0x20B010DE",
    "NVIDIA A100-SXM4-80GB": "0x20B210DE",
}


@dataclass(frozen=True)
class GpuDescription:
    """One physical GPU of a lab node, as `nvidia-smi -L` would name it."""

    index: int
    product: str
    uuid: str
    memory_mib: int

    @property
    def pci_device_id(self) -> str:
        """Its product's PCI device id; "" for a product the lab has no id of."""
        return PCI_DEVICE_IDS.get(self.product, "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LabNode:
    """What every lab node is: its name, address, containerd series, GPUs and driver."""

    name: str
    address: str
    containerd: str
    gpus: tuple[GpuDescription, ...]
    driver_version: str


@dataclass(frozen=True)
class NodeDescription(LabNode):
    """One node of lab.json: a lab node and where its root filesystem lies."""

    root: Path | None = None


@dataclass(frozen=True)
class EndpointDescription:
    """An SSH endpoint of lab.json: its own name and address, served by one node's sshd
    (rollout.lab.endpoints): the node's files, and a Node object of its own in the API."""

    name: str
    address: str
    node: str


@dataclass(frozen=True)
class LabDescription:
    """The whole lab: the API endpoint, device-plugin timing, the nodes, timing overrides."""

    nodes: tuple[NodeDescription, ...]
    api_host: str = "127.0.0.1"
    api_port: int = DEFAULT_API_PORT
    device_plugin_grace_s: float = DEFAULT_DEVICE_PLUGIN_GRACE_S
    # Optional "simulation" object of lab.json: SimulationTimings field names to values.
    timings: Mapping[str, float] = field(default_factory=dict)
    endpoints: tuple[EndpointDescription, ...] = ()

    def find_node(self, name: str) -> NodeDescription | None:
        return next((n for n in self.nodes if n.name == name), None)

    @classmethod
    def from_file(cls, path: Path) -> LabDescription:
        """Read lab.json; InputError (exit code 2) naming the file and field on any problem."""
        location = SourceLocation(str(path))
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise InputError(location, f"cannot read the lab description: {error}") from error
        except json.JSONDecodeError as error:
            raise InputError(
                SourceLocation(str(path), error.lineno, error.colno), f"not JSON: {error.msg}"
            ) from error
        return cls.from_dict(data, location)

    @classmethod
    def from_dict(cls, data: Any, location: SourceLocation | None = None) -> LabDescription:
        where = location or SourceLocation("lab.json")
        reader = _Reader(where)
        root = reader.mapping(data, "")
        api = reader.mapping(root.get("api", {}), "api")
        nodes = tuple(
            _read_node(reader, node, f"nodes[{i}]")
            for i, node in enumerate(reader.sequence(root.get("nodes"), "nodes"))
        )
        names = [n.name for n in nodes]
        for name in names:
            if names.count(name) > 1:
                raise InputError(where, f"node {name!r} is listed twice", field="nodes")
        timings = reader.mapping(root.get("simulation", {}), "simulation")
        endpoints = tuple(
            _read_endpoint(reader, endpoint, f"endpoints[{i}]")
            for i, endpoint in enumerate(reader.sequence(root.get("endpoints", []), "endpoints"))
        )
        for endpoint in endpoints:
            if endpoint.name in names or endpoint.node not in names:
                raise InputError(
                    where,
                    f"endpoint {endpoint.name!r} must have a name of its own and name a node",
                    field="endpoints",
                )
        return cls(
            nodes=nodes,
            api_host=reader.text(api.get("host", "127.0.0.1"), "api.host"),
            api_port=reader.integer(api.get("port", DEFAULT_API_PORT), "api.port"),
            device_plugin_grace_s=reader.number(
                root.get("device_plugin_grace_s", DEFAULT_DEVICE_PLUGIN_GRACE_S),
                "device_plugin_grace_s",
            ),
            timings={str(k): reader.number(v, f"simulation.{k}") for k, v in timings.items()},
            endpoints=endpoints,
        )


def _read_endpoint(reader: _Reader, data: Any, where: str) -> EndpointDescription:
    endpoint = reader.mapping(data, where)
    return EndpointDescription(
        name=reader.text(endpoint.get("name"), f"{where}.name"),
        address=reader.text(endpoint.get("address"), f"{where}.address"),
        node=reader.text(endpoint.get("node"), f"{where}.node"),
    )


def _read_node(reader: _Reader, data: Any, where: str) -> NodeDescription:
    node = reader.mapping(data, where)
    gpus = tuple(
        GpuDescription(
            index=reader.integer(gpu.get("index", i), f"{where}.gpus[{i}].index"),
            product=reader.text(gpu.get("product"), f"{where}.gpus[{i}].product"),
            uuid=reader.text(gpu.get("uuid"), f"{where}.gpus[{i}].uuid"),
            memory_mib=reader.integer(gpu.get("memory_mib", 0), f"{where}.gpus[{i}].memory_mib"),
        )
        for i, gpu in enumerate(
            reader.mapping(g, f"{where}.gpus[{j}]")
            for j, g in enumerate(reader.sequence(node.get("gpus", []), f"{where}.gpus"))
        )
    )
    root = node.get("root")
    return NodeDescription(
        name=reader.text(node.get("name"), f"{where}.name"),
        address=reader.text(node.get("address", "127.0.0.1"), f"{where}.address"),
        containerd=reader.text(node.get("containerd", ""), f"{where}.containerd"),
        gpus=gpus,
        driver_version=reader.text(node.get("driver_version", ""), f"{where}.driver_version"),
        root=Path(reader.text(root, f"{where}.root")) if root else None,
    )


@dataclass(frozen=True)
class _Reader:
    """Typed reads from decoded JSON, failing with the field path."""

    location: SourceLocation

    def _fail(self, where: str, what: str) -> InputError:
        return InputError(self.location, what, field=where or None)

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._fail(where, "expected an object")
        return value

    def sequence(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self._fail(where, "expected a list")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or (
            not value and not where.endswith(("containerd", "driver_version"))
        ):
            raise self._fail(where, "expected a non-empty string")
        return value

    def integer(self, value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(where, "expected an integer")
        return value

    def number(self, value: Any, where: str) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise self._fail(where, "expected a non-negative number")
        return float(value)
