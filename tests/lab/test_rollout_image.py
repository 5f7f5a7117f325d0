"""rollout's image built from the repository's Containerfile with the real buildah, offline,
from a locally debootstrapped base: it runs as its non-root user, reports the checkout's
commit, plans the examples, and pushes to the lab's docker-registry, pulled back by digest.

The first build pays for a debootstrap, the dependencies' wheels and the build; afterwards
an unchanged checkout reuses the image (its key is a digest of the inputs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.registry import registry_available, start_registry, stop_registry
from rollout.lab.registryimages import MANIFEST_TYPE
from rollout.lab.rolloutimage import (
    RolloutImage,
    build_rollout_image,
    builder_available,
    image_config,
    push_rollout_image,
    run_in_image,
)
from tests.conftest import require
from tests.examples import REPO

pytestmark = [pytest.mark.lab]


@pytest.fixture(scope="module")
def image() -> RolloutImage:
    if os.geteuid() != 0:
        require("building the image needs root (debootstrap, buildah's storage)")
    if not builder_available():
        require("buildah is missing: scripts/setup --lab installs it")
    return build_rollout_image(REPO, progress=lambda line: None)


@pytest.fixture()
def registry(tmp_path: Path) -> Iterator[str]:
    if not registry_available():
        require("docker-registry is missing: scripts/setup --lab installs it")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    host = f"127.0.0.1:{port}"
    start_registry(tmp_path, host, progress=lambda line: None)
    try:
        yield host
    finally:
        stop_registry(tmp_path, progress=lambda line: None)


def test_the_image_runs_rollout_as_its_non_root_user_and_names_the_commit(
    image: RolloutImage,
) -> None:
    config = image_config(image)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["rollout"]
    # a state directory named in the image would keep a pod's run off the cluster, in a
    # directory of its read-only root (docs/schedule.md)
    assert not any(e.startswith("ROLLOUT_STATE_DIR=") for e in config["Env"]), config["Env"]
    version = run_in_image(image, ["version", "--output", "json"])
    assert version.ok, version.stderr
    reported = json.loads(version.stdout)
    assert image.commit is not None
    assert reported["commit"] == image.commit
    # the checkout's own commit (HEAD when the image was built)
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{image.commit}^{{commit}}"])
    assert known.returncode == 0
    assert reported["commit_source"] == "build"
    who = run_in_image(image, [], entrypoint=["id", "-u"])
    assert who.stdout.strip() == "65532"
    # a name for it: paramiko's SSH config asks getpass for the local user at each connection
    named = run_in_image(
        image, [], entrypoint=["python3", "-c", "import getpass; print(getpass.getuser())"]
    )
    assert named.stdout.strip() == "rollout", named.stderr


def test_an_unchanged_checkout_reuses_the_image(image: RolloutImage) -> None:
    lines: list[str] = []
    again = build_rollout_image(REPO, progress=lines.append)
    assert again == image
    assert lines == []  # nothing was built, not even the base


def test_the_image_plans_the_examples_it_ships(image: RolloutImage) -> None:
    script = "cd /tmp && rollout init demo && cd demo && rollout plan plan.yaml --facts facts"
    planned = run_in_image(image, [], entrypoint=["sh", "-c", script])
    assert planned.ok, planned.stdout + planned.stderr
    assert "4 of 4 node(s) change" in planned.stdout


def test_the_image_is_pushed_to_the_lab_registry_by_digest(
    image: RolloutImage, registry: str
) -> None:
    pinned = push_rollout_image(image, registry)
    name, _, digest = pinned.partition("@")
    assert name == f"{registry}/rollout" and digest.startswith("sha256:")
    request = urllib.request.Request(f"http://{registry}/v2/rollout/manifests/{digest}")
    request.add_header("Accept", MANIFEST_TYPE)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        manifest = json.loads(response.read())
    assert manifest["mediaType"] == MANIFEST_TYPE and manifest["layers"]
