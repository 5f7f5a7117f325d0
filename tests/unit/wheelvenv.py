"""A fresh virtual environment holding one built wheel of rollout, outside the checkout, and
commands run in it as an installed user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv at `venv` holding only the wheel; its dependencies come from this
    interpreter's site-packages through a .pth line (offline, and without the checkout's
    editable hook: .pth files are not processed in a directory added that way)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = ["install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        check=True,
        timeout=300,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def run_in(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` run in `cwd`, without the ROLLOUT_ and PYTHON settings of this session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_", "PYTHON"))}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
