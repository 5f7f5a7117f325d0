"""The transport errors and the retry policies import none of the libraries they translate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import rollout

PACKAGE = Path(rollout.__file__).parent


def test_errors_and_retry_load_without_the_transport_libraries() -> None:
    code = (
        "import sys, rollout.retry, rollout.transports.errors\n"
        "loaded = {'paramiko', 'fabric', 'kubernetes', 'invoke'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_the_retry_module_imports_tenacity() -> None:
    importers = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(import|from) tenacity\b", path.read_text(), re.MULTILINE)
    ]
    assert importers == ["retry.py"]
