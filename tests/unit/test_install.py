"""Installed as a user installs it: the sdist and the wheel built from a git checkout (a copy
of the source, committed), the wheel in a fresh venv outside the tree, and from an empty
directory `rollout init`, `plan --facts`, `diagnose --facts`, `schedule` and `version`.
Also `rollout init` itself, the build hooks' commit record, and every example of --help."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rollout.cli import COMMANDS, build_parser, main
from rollout.version import BUILD_FILE, read_build_file, record_build
from tests.conftest import require
from tests.examples import REPO
from tests.unit.wheelvenv import install_wheel, run_in

EXAMPLES = REPO / "rollout" / "examples"
IMAGE = "registry.example/rollout@sha256:" + "ab" * 32
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]


def commit_all(checkout: Path) -> str:
    """`checkout` made a git repository holding everything in it, committed; its commit."""
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run([*GIT, "-C", str(checkout), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(checkout), "commit", "-q", "-m", "build"], check=True)
    head = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return head.stdout.strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A git checkout of what a release is built from (the package with its linked
    playbooks followed, as a clone of the repository has them), and its commit."""
    source = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", BUILD_FILE)
    shutil.copytree(REPO / "rollout", source / "rollout", ignore=ignore)
    return source, commit_all(source)


@pytest.fixture(scope="module")
def dist(checkout: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, as `python -m build` makes a release (without
    isolation: the build backend is this environment's setuptools, no index needed)."""
    if importlib.util.find_spec("build") is None:
        require("python -m build is missing: scripts/setup --test installs the test extra")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(checkout[0])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    (wheel,) = dist.glob("gpu_rollout-*-py3-none-any.whl")
    return install_wheel(wheel, tmp_path_factory.mktemp("venv"))


def test_the_sdist_and_the_wheel_carry_the_examples_and_the_commit(
    dist: Path, checkout: tuple[Path, str]
) -> None:
    (sdist,) = dist.glob("gpu_rollout-*.tar.gz")
    (wheel,) = dist.glob("gpu_rollout-*.whl")
    examples = sorted(p.relative_to(REPO).as_posix() for p in EXAMPLES.rglob("*") if p.is_file())
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        in_sdist = set(archive.getnames())
        recorded = archive.extractfile(f"{top}/rollout/{BUILD_FILE}")
        assert recorded is not None
        assert json.load(recorded) == {"commit": checkout[1], "dirty": False}
    assert {f"{top}/{name}" for name in examples} <= in_sdist
    assert f"{top}/rollout/playbooks/containerd.yaml" in in_sdist  # the link followed
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert set(examples) <= in_wheel
    assert "rollout/playbooks/containerd.yaml" in in_wheel
    recorded_in_wheel = json.loads(zipfile.ZipFile(wheel).read(f"rollout/{BUILD_FILE}"))
    assert recorded_in_wheel == {"commit": checkout[1], "dirty": False}


def test_the_installed_wheel_runs_from_an_empty_directory(
    venv: Path, checkout: tuple[Path, str], tmp_path: Path
) -> None:
    rollout = str(venv / "bin" / "rollout")
    where = run_in(
        tmp_path, str(venv / "bin" / "python"), "-c", "import rollout; print(rollout.__file__)"
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where

    init = run_in(tmp_path, rollout, "init")
    assert init.returncode == 0, init.stderr
    assert init.stdout.startswith("wrote 20 files into .:")
    assert "rollout plan plan.yaml --facts facts" in init.stdout
    assert sorted(p.name for p in (tmp_path / "inventory").iterdir()) == [
        "example-ansible.yaml",
        "example.ini",
        "example.yaml",
    ]

    plan = run_in(tmp_path, rollout, "plan", "plan.yaml", "--facts", "facts")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("Plan registry-mirror: containerd on 4 node(s) in 3 wave(s)")
    assert "4 of 4 node(s) change" in plan.stdout

    diagnose = run_in(tmp_path, rollout, "diagnose", "--facts", "facts")
    assert diagnose.returncode == 1, diagnose.stderr  # gpu-a-3's drop-in shadows the toolkit's
    assert diagnose.stdout.startswith("Diagnosis of 4 node(s): NOT healthy; findings on gpu-a-3")
    assert "error gpu-a-3 runtime runtime.handler-missing" in diagnose.stdout

    schedule = run_in(
        tmp_path,
        *(rollout, "schedule", "plan.yaml", "-i", "inventory/example.yaml"),
        *("--cron", "0 22 * * fri", "--image", IMAGE, "--output", "json"),
    )
    assert schedule.returncode == 0, schedule.stderr
    objects = json.loads(schedule.stdout)["items"]
    (cronjob,) = (o for o in objects if o["kind"] == "CronJob")
    assert cronjob["spec"]["schedule"] == "0 22 * * fri"
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE

    version = run_in(tmp_path, rollout, "version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"rollout 0.1.0 ({checkout[1]}), Python ")


def test_init_writes_the_examples_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "starter"
    assert main(["init", str(target)]) == 0
    said = capsys.readouterr().out
    written = {p.relative_to(target) for p in target.rglob("*") if p.is_file()}
    assert written == {p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*") if p.is_file()}
    assert all((target / p).read_bytes() == (EXAMPLES / p).read_bytes() for p in written)
    lines = said.splitlines()
    assert lines[0] == f"wrote 20 files into {target}:"
    assert lines[1].split()[:3] == ["plan.yaml", "Point", "every"]  # its first comment line
    assert any(line.split()[:1] == ["inventory/example.ini"] for line in lines)
    assert f"  cd {target}" in lines

    (target / "plan.yaml").write_text("mine\n")
    assert main(["init", str(target)]) == 2
    refused = capsys.readouterr().err
    assert "20 of the starter files exist already" in refused and "--force" in refused
    assert (target / "plan.yaml").read_text() == "mine\n"

    assert main(["init", str(target), "--force"]) == 0
    assert (target / "plan.yaml").read_bytes() == (EXAMPLES / "plan.yaml").read_bytes()


def test_init_writes_nothing_when_one_file_is_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "example.ini").write_text("[mine]\n")
    assert main(["init", str(tmp_path)]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["example.ini", "inventory"]


def test_the_top_level_examples_and_inventory_are_the_package_s() -> None:
    assert (REPO / "examples").resolve() == EXAMPLES.resolve()
    assert (REPO / "inventory").resolve() == (EXAMPLES / "inventory").resolve()


def test_a_build_from_a_checkout_records_its_commit(tmp_path: Path) -> None:
    package = tmp_path / "checkout" / "rollout"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    built = tmp_path / "built"
    assert record_build(package, built) is None  # not a checkout: nothing to record
    commit = commit_all(package.parent)
    (package / "__init__.py").write_text("# changed\n")
    assert record_build(package, built) == built / BUILD_FILE
    recorded = read_build_file(built / BUILD_FILE)
    assert recorded is not None and (recorded.commit, recorded.dirty) == (commit, True)
    # a source that carries its record (an sdist, the Containerfile's) keeps that one
    (package / BUILD_FILE).write_text(json.dumps({"commit": "f" * 40}))
    (built / BUILD_FILE).unlink()
    assert record_build(package, built) is None and not (built / BUILD_FILE).exists()


# Every example line of every command's --help that runs without a cluster or a placeholder,
# and the exit status it gives in the directory `rollout init` writes.
RUNNABLE = {
    "rollout init starter": 0,
    "rollout plan plan.yaml --facts facts": 0,
    "rollout plan plan.yaml --facts facts --output json --detailed-exitcode": 2,
    "rollout plan plan.yaml --facts facts --output markdown": 0,
    "rollout plan plan.yaml --facts facts --detailed-exitcode": 2,
    "rollout diagnose --facts facts": 1,
    "rollout diagnose gpu-a-3 --facts facts --output json": 1,
    "rollout diagnose --facts facts --fix fix.yaml": 1,
    "rollout plan fix.yaml --facts facts": 0,
}
PLACEHOLDER = re.compile(r"\b(LAB|IMAGE|RUN|NODE|REPOSITORY)\b|~|\$\(|^rollout (lab|apply|resume)")


def help_examples() -> list[str]:
    """The command lines of every --help's examples, shell redirections and pipes cut off."""
    parser = build_parser()
    texts = [parser.epilog or ""]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts += [sub.epilog or "" for sub in subparsers.choices.values()]
    lines: list[str] = []
    for text in texts:
        joined = text.replace("\\\n", " ")
        for line in joined.splitlines():
            words = line.strip().split("#")[0]
            if words.startswith("rollout "):
                lines.append(re.split(r"\s*(?:&&|;|\||>)\s*", words)[0].strip())
    return lines


def test_no_help_text_names_the_checkout_s_examples_directory() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts = [parser.format_help()] + [sub.format_help() for sub in subparsers.choices.values()]
    assert len(texts) == len(COMMANDS) + 1
    assert [t for t in texts if "examples/" in t] == []


def test_every_help_example_runs_in_the_directory_init_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", str(tmp_path)]) == 0
    monkeypatch.chdir(tmp_path)
    examples = help_examples()
    runnable = list(dict.fromkeys(line for line in examples if not PLACEHOLDER.search(line)))
    assert sorted(runnable) == sorted(RUNNABLE), "a new --help example: add it to RUNNABLE"
    for line in runnable:
        assert main(shlex.split(line)[1:]) == RUNNABLE[line], (line, capsys.readouterr().err)
    capsys.readouterr()
