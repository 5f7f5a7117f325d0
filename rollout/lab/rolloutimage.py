"""rollout's own image, built for real from the repository's Containerfile with Debian's
buildah, offline, and pushed to the lab's registry.

- base: a debootstrapped Debian tree (the node image's suite and mirror) with python3 and
  python3-venv, imported as the image `BASE_REPOSITORY:<key>` (`buildah from scratch`, copy
  the tree, commit) and passed as the Containerfile's PYTHON_IMAGE instead of Docker Hub's;
- wheels: rollout's build backend and every dependency's wheel, built once per dependency
  list by this interpreter's pip and mounted into the build as the Containerfile's WHEELS, so
  the build itself reaches no package index;
- the image: `buildah bud` of the Containerfile over a copy of exactly what it copies, with
  ROLLOUT_COMMIT from git, tagged `IMAGE_REPOSITORY:<key>`, where the key is a digest of
  every input (the copied files, the commit, the base and the wheels): an unchanged checkout
  reuses the image and pays for no build.

Everything lives under <cache>/rollout-image/: base-<key>/ (the tree), wheels-<key>/,
storage/ and run/ (buildah's own, apart from the machine's /var/lib/containers).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.commands import CommandFailed, CommandResult, check
from rollout.containerd.binaries import cache_dir
from rollout.errors import RolloutError
from rollout.lab.image import SUITE, build_lock
from rollout.lab.prerequisites import find_debian_mirror
from rollout.transports.local import LocalRunner
from rollout.version import read_git_commit

BUILDER = "buildah"
BASE_PACKAGES = ("python3", "python3-venv")
BASE_REPOSITORY = "localhost/rollout-lab-python"
IMAGE_REPOSITORY = "localhost/rollout"
# What the Containerfile copies from the checkout, and the Containerfile itself.
CONTEXT_FILES = ("Containerfile", "pyproject.toml", "setup.py", "README.md")
CONTEXT_TREES = ("rollout", "playbooks")
# Bump when a step here changes in a way the inputs do not capture.
RECIPE = "1"
WHEELS_MOUNT = "/wheels-in"
# Images of rollout kept in the storage (the newest; one per checkout state built).
KEPT_IMAGES = 3

DEBOOTSTRAP_TIMEOUT_S = 1800.0
PIP_TIMEOUT_S = 1200.0
BUILD_TIMEOUT_S = 1800.0
STEP_TIMEOUT_S = 300.0

Progress = Callable[[str], None]


class RolloutImageFailed(RolloutError):
    """rollout's image could not be built or pushed."""


@dataclass(frozen=True)
class RolloutImage:
    """A built image in the builder's storage, by reference (`localhost/rollout:<key>`)."""

    reference: str
    key: str
    commit: str | None


def image_cache() -> Path:
    return cache_dir() / "rollout-image"


def builder_available() -> bool:
    return shutil.which(BUILDER) is not None


def build_rollout_image(checkout: Path, progress: Progress = print) -> RolloutImage:
    """The image of `checkout`'s Containerfile: from the builder's storage when its inputs
    are unchanged, else built (locked against a concurrent build)."""
    if not builder_available():
        raise RolloutImageFailed(
            f"{BUILDER} not found: install Debian's buildah (scripts/setup --lab)"
        )
    if not (checkout / "Containerfile").is_file():
        raise RolloutImageFailed(
            f"no Containerfile in {checkout}: the image builds from a checkout"
        )
    root = image_cache()
    root.mkdir(parents=True, exist_ok=True)
    with build_lock(root / ".lock", progress):
        base = _ensure_base(root, progress)
        wheels = _ensure_wheels(root, checkout, progress)
        found = read_git_commit(checkout)
        commit = found.commit if found is not None else None
        with tempfile.TemporaryDirectory(prefix="rollout-image-") as staging:
            context = Path(staging)
            _stage_context(checkout, context)
            key = _digest_inputs(context, [base, wheels.name, commit or "", RECIPE])
            image = RolloutImage(f"{IMAGE_REPOSITORY}:{key}", key, commit)
            if _image_exists(image.reference):
                return image
            progress(f"rollout image: buildah bud {image.reference} (from {base})")
            argv = [
                "bud",
                "--isolation",
                "chroot",
                "--pull-never",
                "--build-arg",
                f"PYTHON_IMAGE={base}",
                "--build-arg",
                f"ROLLOUT_COMMIT={commit or ''}",
                "--build-arg",
                f"WHEELS={WHEELS_MOUNT}",
                "--volume",
                f"{wheels}:{WHEELS_MOUNT}:ro",
                "--tag",
                image.reference,
                "--file",
                str(context / "Containerfile"),
                str(context),
            ]
            _buildah(argv, "buildah bud of the Containerfile", timeout_s=BUILD_TIMEOUT_S)
        _remove_old_images()
        return image


def push_rollout_image(image: RolloutImage, registry: str) -> str:
    """Push the image to the registry at host:port; its reference there, pinned by digest
    (`host:port/rollout@sha256:...`, as `rollout schedule --image` takes it)."""
    repository = IMAGE_REPOSITORY.split("/", 1)[1]
    with tempfile.TemporaryDirectory(prefix="rollout-image-push-") as staging:
        digest_file = Path(staging) / "digest"
        destination = f"docker://{registry}/{repository}:{image.key}"
        # the manifest type the lab's own images have (registryimages.MANIFEST_TYPE)
        argv = ["push", "--tls-verify=false", "--format", "v2s2", "--digestfile", str(digest_file)]
        _buildah([*argv, image.reference, destination], f"pushing {image.reference}")
        digest = digest_file.read_text().strip()
    return f"{registry}/{repository}@{digest}"


def run_in_image(
    image: RolloutImage, argv: Sequence[str], *, entrypoint: Sequence[str] = ("rollout",)
) -> CommandResult:
    """`entrypoint argv` run in a container of the image (buildah run, as the image's user)."""
    container = _buildah(["from", "--pull-never", image.reference], "buildah from").stdout.strip()
    try:
        command = [*_global_flags(), "run", "--isolation", "chroot", container, "--"]
        return _runner().run([*command, *entrypoint, *argv], timeout_s=STEP_TIMEOUT_S)
    finally:
        _buildah(["rm", container], "buildah rm")


def image_config(image: RolloutImage) -> dict[str, Any]:
    """The image's OCI config (User, Entrypoint, Env, ...), as buildah inspect reads it."""
    shown = _buildah(["inspect", "--type", "image", image.reference], "buildah inspect")
    config: dict[str, Any] = json.loads(shown.stdout)["OCIv1"]["config"]
    return config


def _ensure_base(root: Path, progress: Progress) -> str:
    mirror = find_debian_mirror()
    key = _digest_json({"suite": SUITE, "packages": BASE_PACKAGES, "recipe": RECIPE})
    reference = f"{BASE_REPOSITORY}:{key}"
    if _image_exists(reference):
        return reference
    tree = root / f"base-{key}"
    if not (tree / "usr/bin/python3").exists():
        shutil.rmtree(tree, ignore_errors=True)
        progress(
            f"rollout image: debootstrap {SUITE} with {', '.join(BASE_PACKAGES)} from {mirror}"
        )
        argv = [
            "debootstrap",
            "--variant=minbase",
            "--include=" + ",".join(BASE_PACKAGES),
            SUITE,
            str(tree),
            mirror,
        ]
        _run(argv, "debootstrap of the image base", timeout_s=DEBOOTSTRAP_TIMEOUT_S)
        # the apt cache and lists are of no use in an image
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (tree / cache).glob("*.deb" if "archives" in cache else "*_*"):
                item.unlink()
    progress(f"rollout image: importing the base tree as {reference}")
    container = _buildah(["from", "scratch"], "buildah from scratch").stdout.strip()
    try:
        _buildah(["copy", container, f"{tree}/", "/"], "copying the base tree")
        _buildah(["config", "--cmd", "/bin/sh", container], "buildah config")
        _buildah(["commit", "--rm", container, reference], "committing the base image")
    except RolloutImageFailed:
        _runner().run([*_global_flags(), "rm", container])
        raise
    shutil.rmtree(tree)
    return reference


def _ensure_wheels(root: Path, checkout: Path, progress: Progress) -> Path:
    """Wheels of the build backend and of every dependency, once per dependency list."""
    project = tomllib.loads((checkout / "pyproject.toml").read_text())
    requirements = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = _digest_json({"requirements": requirements, "python": python})
    wheels = root / f"wheels-{key}"
    if (wheels / "complete").is_file():
        return wheels
    shutil.rmtree(wheels, ignore_errors=True)
    progress(f"rollout image: wheels of {len(requirements)} requirements (pip, once)")
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), *requirements]
    _run(argv, "pip wheel of rollout's dependencies", timeout_s=PIP_TIMEOUT_S)
    (wheels / "complete").write_text("")
    return wheels


def _stage_context(checkout: Path, context: Path) -> None:
    for name in CONTEXT_FILES:
        shutil.copy2(checkout / name, context / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build.json")
    for name in CONTEXT_TREES:
        shutil.copytree(checkout / name, context / name, symlinks=True, ignore=ignore)


def _digest_inputs(context: Path, extra: Sequence[str]) -> str:
    digest = hashlib.sha256("\0".join(extra).encode())
    for path in sorted(context.rglob("*")):
        relative = path.relative_to(context).as_posix()
        if path.is_symlink():
            digest.update(f"link {relative} {path.readlink()}\0".encode())
        elif path.is_file():
            digest.update(f"file {relative} {path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _remove_old_images() -> None:
    """Images of older inputs go once KEPT_IMAGES newer ones exist: the storage stays
    bounded, and a build beside another (a second pytest process) keeps the image the other
    one is still using."""
    listed = json.loads(_buildah(["images", "--json"], "buildah images").stdout or "[]")
    ours = [
        (int(entry["created"]), name)
        for entry in listed
        for name in entry.get("names") or []
        if name.startswith(f"{IMAGE_REPOSITORY}:")
    ]
    # best effort: storage busy with another build (its lock held) must not fail this one;
    # the next build prunes again
    removals = [["rmi", ref] for _, ref in sorted(ours, reverse=True)[KEPT_IMAGES:]]
    for argv in [*removals, ["rmi", "--prune"]]:
        with contextlib.suppress(RolloutError):
            _runner().run([*_global_flags(), *argv], timeout_s=STEP_TIMEOUT_S)


def _digest_json(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _image_exists(reference: str) -> bool:
    return _runner().run([*_global_flags(), "inspect", "--type", "image", reference]).ok


def _global_flags() -> list[str]:
    """buildah's storage under the rollout cache, apart from the machine's own."""
    root = image_cache()
    return [BUILDER, "--root", str(root / "storage"), "--runroot", str(root / "run")]


def _runner() -> LocalRunner:
    return LocalRunner()


def _buildah(argv: Sequence[str], what: str, *, timeout_s: float = STEP_TIMEOUT_S) -> CommandResult:
    return _run([*_global_flags(), *argv], what, timeout_s=timeout_s)


def _run(argv: Sequence[str], what: str, *, timeout_s: float = STEP_TIMEOUT_S) -> CommandResult:
    try:
        return check(_runner().run(argv, timeout_s=timeout_s), what)
    except CommandFailed as exc:
        raise RolloutImageFailed(str(exc)) from exc
