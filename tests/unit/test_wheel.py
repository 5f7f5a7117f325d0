"""The built wheel works anywhere: built from a copy of the source, installed into a fresh
venv outside the checkout, it plans the examples from recorded facts (no lab) exactly as the
checkout does, and it carries every data file rollout reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.examples import REPO
from tests.unit.wheelvenv import install_wheel, run_in

PACKAGE = REPO / "rollout"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def containerfile_script() -> str:
    """The Python the Containerfile's build stage runs to record ROLLOUT_COMMIT."""
    text = (REPO / "Containerfile").read_text()
    return text.split("RUN python3 -c '", 1)[1].split("' \"$ROLLOUT_COMMIT\"\n", 1)[0]


def record_commit(source: Path, commit: str) -> subprocess.CompletedProcess[str]:
    """Run the Containerfile's build-stage step in `source`, as `podman build` would."""
    script = containerfile_script()
    return subprocess.run(
        [sys.executable, "-c", script, commit], cwd=source, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the Containerfile copies, with the commit recorded as its build stage
    records it."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "rollout", ignore=shutil.ignore_patterns("__pycache__"))
    recorded = record_commit(source, COMMIT)
    assert recorded.returncode == 0, recorded.stderr
    return source


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from the copy (an in-tree build would leave build/ and egg-info
    in the checkout); build isolation fetches the build backend pyproject.toml names from
    the package index, as `pipx install .` does."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("gpu_rollout-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the wheel."""
    return install_wheel(wheel, tmp_path_factory.mktemp("venv"))


def test_the_wheel_carries_every_data_file_of_the_package(wheel: Path, source: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {
        path.relative_to(source).as_posix()
        for path in (source / "rollout").rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert {"rollout/playbooks/containerd.yaml", "rollout/build.json"} <= data
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
    # the lab plan: a containerd change and a time-slicing profile, every playbook but driver
    args = ("plan", "examples/lab-plan.yaml", "--facts", "examples/facts", "--output", "json")
    from_wheel = run_in(tmp_path, rollout, *args)
    assert from_wheel.returncode == 0, from_wheel.stderr
    from_checkout = run_in(tmp_path, sys.executable, "-m", "rollout", *args)
    assert json.loads(from_wheel.stdout) == json.loads(from_checkout.stdout)
    text = run_in(tmp_path, rollout, "plan", "examples/plan.yaml", "--facts", "examples/facts")
    assert text.returncode == 0 and "4 of 4 node(s) change" in text.stdout


def test_the_installed_build_reports_its_commit_and_python(installed: Path, tmp_path: Path) -> None:
    done = run_in(tmp_path, str(installed / "bin" / "rollout"), "version", "--output", "json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    python = run_in(
        tmp_path,
        str(installed / "bin" / "python"),
        "-c",
        "import platform; print(platform.python_version())",
    )
    assert info["commit"] == COMMIT and info["commit_source"] == "build"
    assert info["python"]["version"] == python.stdout.strip()
    assert (
        info["version"]
        == subprocess.run(
            [str(installed / "bin" / "python"), "-c", "import rollout; print(rollout.__version__)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


def test_the_containerfile_refuses_a_commit_that_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "rollout").mkdir()
    refused = record_commit(tmp_path, "main; rm -rf /")
    assert refused.returncode != 0 and "is not a git commit id" in refused.stderr
    assert not (tmp_path / "rollout" / "build.json").exists()
    assert record_commit(tmp_path, "").returncode == 0
    assert not (tmp_path / "rollout" / "build.json").exists()  # unknown stays unknown


def test_the_containerfile_installs_offline_from_its_own_wheels_as_non_root() -> None:
    lines = [line.strip() for line in (REPO / "Containerfile").read_text().splitlines()]
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    installs = [line for line in final if "pip install" in line]
    assert installs and all("--no-index" in line for line in installs)
    assert "USER 65532:65532" in final and 'ENTRYPOINT ["rollout"]' in final
    assert (
        "COPY rollout ./rollout" in lines and "COPY pyproject.toml setup.py README.md ./" in lines
    )
