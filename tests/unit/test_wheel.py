"""The built wheel works anywhere: built from a copy of the source, installed into a fresh
venv outside the checkout, it plans the examples from recorded facts (no lab) exactly as the
checkout does, and it carries every data file rollout reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.examples import REPO

PACKAGE = REPO / "rollout"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a copy of the sources (an in-tree build would leave build/
    and egg-info in the checkout); build isolation fetches the build backend pyproject.toml
    names from the package index, as `pipx install .` does."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "rollout", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("rollout-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the wheel; its dependencies come from this interpreter's
    site-packages through a .pth line (offline, and without the checkout's editable hook:
    .pth files are not processed in a directory added that way)."""
    venv = tmp_path_factory.mktemp("venv")
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_", "PYTHON"))}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_carries_every_data_file_of_the_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {
        path.relative_to(REPO).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert {"rollout/playbooks/containerd.yaml", "rollout/lab/data/rbac.yaml"} <= data
    assert data - names == set()


def test_the_installed_wheel_plans_the_examples_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    where = run_in(
        tmp_path, str(installed / "bin" / "python"), "-c", "import rollout; print(rollout.__file__)"
    )
    assert Path(where.stdout.strip()).is_relative_to(installed), where
    rollout = str(installed / "bin" / "rollout")
    for plan in ("plan.yaml", "lab-plan.yaml"):
        args = ("plan", f"examples/{plan}", "--facts", "examples/facts", "--output", "json")
        from_wheel = run_in(tmp_path, rollout, *args)
        assert from_wheel.returncode == 0, from_wheel.stderr
        from_checkout = run_in(tmp_path, sys.executable, "-m", "rollout", *args)
        assert json.loads(from_wheel.stdout) == json.loads(from_checkout.stdout), plan
    text = run_in(tmp_path, rollout, "plan", "examples/plan.yaml", "--facts", "examples/facts")
    assert text.returncode == 0 and "Summary: 4 of 4 node(s) change" in text.stdout
