"""Documents for tools: `-o json` and `-o yaml` write the same data, in either syntax."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any, TextIO

import yaml

from rollout.cli.render import write_plan_json
from rollout.plan import Plan

# the --output choices that write a document (the rest draw text for people)
DOCUMENT_FORMATS = ("json", "yaml")


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """YAML with multi-line text (file contents, diffs) as literal blocks, read as written."""


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_text)


def yaml_text(data: Any) -> str:
    """`data` (JSON-able) as a YAML document, keys in their order."""
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    return text


def write_document(data: Any, output: str, stream: TextIO) -> None:
    """`data` (JSON-able) as the `output` document: json (indented) or yaml."""
    if output == "yaml":
        stream.write(yaml_text(data))
    else:
        stream.write(json.dumps(data, indent=2) + "\n")


def write_plan_document(
    plan: Plan, output: str, stream: TextIO, forecast: Mapping[str, object] | None = None
) -> None:
    """The plan as `rollout plan -o json` writes it, or the same data as YAML."""
    if output == "json":
        write_plan_json(plan, stream, forecast)
        return
    text = io.StringIO()
    write_plan_json(plan, text, forecast)
    stream.write(yaml_text(json.loads(text.getvalue())))
