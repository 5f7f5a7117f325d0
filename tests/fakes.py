"""Test doubles shared by the suites: one scripted CommandRunner, and the part of KubeClient
the in-memory fakes of it share (nodes, pods and Events)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.commands import CommandResult, CommandRunner
from rollout.lab.apiserver.selectors import FieldSelector, LabelSelector
from rollout.transports.kube import EventType, Node, Pod
from rollout.transports.runner import ArgvRunner

Reply = str | CommandResult | Callable[[Sequence[str]], CommandResult]


@dataclass(kw_only=True)
class ScriptedRunner(ArgvRunner):
    """A CommandRunner that records every command and replies by argv prefix.

    A list of replies is consumed in order (the last one repeats); a string reply is the
    stdout of a zero exit. A command no prefix matches goes to `inner` when there is one
    (a real runner underneath), and fails the test otherwise. Subclasses that break
    commands on purpose override `answer`.
    """

    name: str = "gpu-1"
    inner: CommandRunner | None = None
    replies: dict[tuple[str, ...], list[Reply]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    inputs: list[bytes | None] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.inner.host if self.inner is not None else self.name

    def on(self, prefix: Sequence[str], *replies: Reply) -> ScriptedRunner:
        self.replies[tuple(prefix)] = list(replies)
        return self

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        self.calls.append(argv)
        self.inputs.append(stdin)
        return self.answer(argv, stdin, timeout_s)

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        """The result of one recorded command: the scripted reply, else the inner runner's."""
        for prefix, queue in sorted(self.replies.items(), key=lambda kv: -len(kv[0])):
            if argv[: len(prefix)] == prefix:
                reply = queue.pop(0) if len(queue) > 1 else queue[0]
                if callable(reply):
                    return reply(argv)
                if isinstance(reply, CommandResult):
                    return reply
                return CommandResult(argv, 0, reply, "", self.host)
        if self.inner is None:
            raise AssertionError(f"unscripted command: {argv}")
        return self.inner.run(argv, stdin=stdin, timeout_s=timeout_s)

    def ran(self, *words: str) -> bool:
        return self.count(*words) > 0

    def count(self, *words: str) -> int:
        """How many recorded commands contain every one of `words` as an argument."""
        return sum(1 for call in self.calls if all(w in call for w in words))


def merge_patched(current: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """Labels or annotations after a merge patch, as the API server applies it: a None value
    removes its key, any other sets it."""
    merged = {**current, **patch}
    return {key: value for key, value in merged.items() if value is not None}


class InMemoryKube:
    """Just enough of KubeClient, in memory, for the steps' tests: nodes patched as the API
    server patches them, pods listed as it filters them (the lab emulator's own selectors),
    and the Events recorded. Each suite's fake adds what its steps read besides."""

    def __init__(self, *nodes: Node) -> None:
        self.nodes = {node.name: node for node in nodes}
        self.pods: dict[Any, Pod] = {}  # keyed as the suite finds them
        self.events: list[tuple[str, str, EventType]] = []

    @property
    def node(self) -> Node:
        """The only node, where the fake has one."""
        (only,) = self.nodes.values()
        return only

    @node.setter
    def node(self, node: Node) -> None:
        self.nodes[node.name] = node

    def get_node(self, name: str) -> Node:
        return self.nodes[name]

    def set_unschedulable(self, name: str, unschedulable: bool) -> Node:
        self.nodes[name] = replace(self.nodes[name], unschedulable=unschedulable)
        return self.nodes[name]

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        patched = merge_patched(self.nodes[name].labels, labels)
        self.nodes[name] = replace(self.nodes[name], labels=patched)
        return self.nodes[name]

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        patched = merge_patched(self.nodes[name].annotations, annotations)
        self.nodes[name] = replace(self.nodes[name], annotations=patched)
        return self.nodes[name]

    def create_event(
        self,
        namespace: str,
        node: str,
        reason: str,
        message: str,
        type: EventType = EventType.NORMAL,
    ) -> str:
        self.events.append((reason, message, type))
        return f"{node}.{len(self.events)}"

    def list_pods(
        self,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Pod]:
        labels = LabelSelector.from_text(label_selector)
        fields = FieldSelector.from_text(field_selector)
        return [
            pod
            for pod in self.pods.values()
            if namespace in (None, pod.namespace)
            and labels.matches(pod.labels)
            and fields.matches(selectable_fields(pod))
        ]


def selectable_fields(pod: Pod) -> dict[str, Any]:
    """The fields of a pod a field selector names, as the API server's JSON has them."""
    return {
        "metadata": {"namespace": pod.namespace, "name": pod.name},
        "spec": {"nodeName": pod.node_name},
        "status": {"phase": pod.phase},
    }
