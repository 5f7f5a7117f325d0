"""The driver engine and the node facts that carry its models import first, each on its own.

rollout.facts.model carries the engine's DriverStatus, DriverKernel and DriverHost, and the
engine states its facts in the frame (rollout.fact): were the frame still under rollout.facts,
whose package re-exports the model, importing an engine module first would load the model,
which would import the half-loaded engine module back (a circle the static layering check
sees only as a graph; this sees it as Python does).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import rollout.driver

FIRST = (
    "rollout.fact",
    "rollout.driver",
    *sorted(f"rollout.driver.{m.name}" for m in pkgutil.iter_modules(rollout.driver.__path__)),
    "rollout.facts.model",
    "rollout.facts",
)

SCRIPT = """\
import importlib, json, sys
failures = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m == "rollout" or m.startswith("rollout.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failures[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failures))
"""


def test_each_driver_module_and_the_node_facts_import_first() -> None:
    assert {"rollout.driver.host", "rollout.driver.status"} <= set(FIRST)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(FIRST)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(result.stdout) == {}
