"""Field types shared by the plan models: strict scalars, names, label keys and values, paths,
node amounts.

Scalars are strict because YAML already types them: `skip_verify: "false"` is a string a
user quoted by mistake, and silently reading it as False would hide that.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainSerializer, PlainValidator, Strict

from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.wholenumber import whole_number

Str = Annotated[str, Strict()]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# a label value, and the name part of a label key
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


class SpecModel(BaseModel):
    """Base of every plan model: immutable, and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_dns_label(value: str) -> str:
    """A DNS-1123 label (what Kubernetes requires of namespaces, Lease names, ...)."""
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise FieldProblem(
            f"expected a DNS label (1-63 lowercase letters, digits and '-', starting and"
            f" ending with a letter or digit), found {describe_value(value)}"
        )
    return value


def check_dns_subdomain(value: str) -> str:
    """A DNS-1123 subdomain (what Kubernetes requires of node and ConfigMap names)."""
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise FieldProblem(
            "expected a Kubernetes name (lowercase letters, digits, '-' and '.', at most 253"
            f" characters), found {describe_value(value)}",
            hint="Kubernetes node names are lowercase; see `kubectl get nodes`"
            if value.lower() != value
            else None,
        )
    return value


def check_absolute_path(value: str) -> str:
    """An absolute POSIX path on the node, without `..` tricks."""
    if not value.startswith("/") or "/../" in value + "/" or "\0" in value:
        raise FieldProblem(
            f"expected an absolute path on the node, found {describe_value(value)}",
            hint="paths in a plan are on the node, e.g. /etc/containerd/certs.d",
        )
    return value


def check_label_key(key: str) -> str | None:
    """Why `key` is not a valid label key, or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"label key name {name!r} must be 1-63 characters of letters, digits, '-', '_', '.',"
            " starting and ending with a letter or digit"
        )
    return None


def check_label_value(value: str) -> str | None:
    """Why `value` is not a valid label value, or None when it is."""
    if value == "":
        return None
    if len(value) > 63 or not _LABEL_NAME.match(value):
        return (
            f"label value {value!r} must be at most 63 characters of letters, digits, '-', '_',"
            " '.', starting and ending with a letter or digit"
        )
    return None


def check_image(value: str) -> str:
    """A container image reference: not empty, no whitespace."""
    if not value or any(c.isspace() for c in value):
        raise FieldProblem(f"expected a container image reference, found {describe_value(value)}")
    return value


DnsLabel = Annotated[str, Strict(), AfterValidator(check_dns_label)]
KubeName = Annotated[str, Strict(), AfterValidator(check_dns_subdomain)]
AbsolutePath = Annotated[str, Strict(), AfterValidator(check_absolute_path)]
ImageRef = Annotated[str, Strict(), AfterValidator(check_image)]


@dataclass(frozen=True)
class NodeAmount:
    """A number of nodes, absolute (`3`) or a percentage of a total (`"25%"`)."""

    value: int
    is_percent: bool = False

    def resolve_up(self, total: int) -> int:
        """Nodes for `total`: a percentage rounded up, never below 1."""
        if not self.is_percent:
            return self.value
        return max(1, math.ceil(total * self.value / 100))

    def resolve_down(self, total: int) -> int:
        """Nodes for `total`: a percentage rounded down, never below 1."""
        if not self.is_percent:
            return self.value
        return max(1, total * self.value // 100)

    def to_yaml(self) -> int | str:
        """The form a plan file writes: an int or "N%"."""
        return f"{self.value}%" if self.is_percent else self.value

    def __str__(self) -> str:
        return str(self.to_yaml())


_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


def parse_node_amount(value: Any) -> NodeAmount:
    """An int >= 1 or a string "N%" with 0 < N <= 100."""
    if isinstance(value, NodeAmount):
        return value
    if isinstance(value, bool):
        raise FieldProblem(f'expected a node count or "N%", found {describe_value(value)}')
    if isinstance(value, int):
        if value < 1:
            raise FieldProblem(f"expected at least 1 node, found {value}")
        return NodeAmount(value)
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match:
            percent = int(match.group(1))
            if not 0 < percent <= 100:
                raise FieldProblem(
                    f"expected a percentage from 1% to 100%, found {describe_value(value)}"
                )
            return NodeAmount(percent, is_percent=True)
        if whole_number(value.strip()) is not None:
            raise FieldProblem(
                f'expected a node count or "N%", found {describe_value(value)}',
                hint=f"write the count without quotes: {value.strip()}",
            )
    hint = None
    if isinstance(value, float) and 0 < value < 1:
        hint = f'write a fraction as a percentage: "{round(value * 100)}%"'
    raise FieldProblem(
        f'expected a node count (an integer >= 1) or a percentage like "25%",'
        f" found {describe_value(value)}",
        hint=hint,
    )


AmountField = Annotated[
    NodeAmount,
    PlainValidator(parse_node_amount),
    PlainSerializer(lambda amount: amount.to_yaml()),
]
