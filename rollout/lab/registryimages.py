"""The images the lab's registry serves, built from Debian packages in the node image's own
apt cache (no network) and pushed with the registry HTTP API.

- pause: the pod sandbox image, tagged as each containerd series' default sandbox image
  (registry.k8s.io/pause:3.6, 3.8, 3.10): dash waiting on coreutils' sleep, and leaving at
  SIGTERM as the real pause does (the init of a PID namespace ignores signals it does not
  handle, so a plain `sleep` would hold a node's shutdown until its SIGKILL).
- smoke: the smoke pod's image, tagged as rollout's default smoke image and as one tag no node
  has pulled before (PULL_ONLY_SMOKE_IMAGE): dash as /bin/sh and the C library. nvidia-smi is
  not in it: the node's `nvidia` runtime (data/nvidia-container-runtime) adds it, as the
  NVIDIA container runtime adds the driver's tools to a container.

Each layer is a deterministic tar.gz (no times, root owned), so a lab pushes the same digests
each time and a node that pulled them once keeps them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout.errors import RolloutError

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBDIR = "usr/lib/x86_64-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"
# The default sandbox image of each containerd series (`containerd config dump`).
PAUSE_IMAGES = (
    "registry.k8s.io/pause:3.6",
    "registry.k8s.io/pause:3.8",
    "registry.k8s.io/pause:3.10",
)
SMOKE_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
# Served, never pulled by `lab up`: a smoke pod naming it proves a pull through the mirror.
PULL_ONLY_SMOKE_IMAGE = "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu22.04"
# rollout's default DCGM image (policy.verify.gates.dcgm.image): the smoke image's layers,
# its dcgmi added by the node's `nvidia` runtime as nvidia-smi is (data/dcgmi).
DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
# What `lab up` pulls into every node besides its containerd's sandbox image (nodes reach
# nvcr.io only through a plan's mirror: a DCGM gate's pod finds its image already there).
PREPULLED = (SMOKE_IMAGE, DCGM_IMAGE)
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
PUSH_TIMEOUT_S = 30.0
DEB_TIMEOUT_S = 60.0


class ImagePushFailed(RolloutError):
    """An image for the lab registry could not be built or pushed."""


@dataclass(frozen=True)
class ImageRef:
    """registry/repository:tag, split as a mirror sees it."""

    registry: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, reference: str) -> ImageRef:
        registry, _, rest = reference.partition("/")
        repository, _, tag = rest.rpartition(":")
        return cls(registry, repository, tag)


@dataclass(frozen=True)
class BuiltImage:
    """An image as blobs: its layer (gzipped), its config and its manifest."""

    layer: bytes
    config: bytes
    manifest: bytes


def build_images(apt_archives: Path) -> dict[str, BuiltImage]:
    """Every image reference the lab serves, built from the .debs in apt_archives."""
    files = _DebFiles(apt_archives)
    libc = {
        f"{LIBDIR}/libc.so.6": files.file("libc6", "x86_64-linux-gnu/libc.so.6"),
        f"{LIBDIR}/{LOADER}": files.file("libc6", f"x86_64-linux-gnu/{LOADER}"),
    }
    shell = {**libc, "usr/bin/dash": files.file("dash", "bin/dash")}
    pause = _build_image(
        {**shell, "usr/bin/sleep": files.file("coreutils", "bin/sleep")},
        {"Entrypoint": ["/bin/sh", "-c", PAUSE_SCRIPT]},
        links={"usr/bin/sh": "dash"},
    )
    smoke = _build_image(shell, {"Cmd": ["/bin/sh"]}, links={"usr/bin/sh": "dash"})
    images = dict.fromkeys(PAUSE_IMAGES, pause)
    images.update(dict.fromkeys((SMOKE_IMAGE, PULL_ONLY_SMOKE_IMAGE, DCGM_IMAGE), smoke))
    return images


def served_namespaces() -> tuple[str, ...]:
    """The registry host namespaces of the images the lab serves (nvcr.io, registry.k8s.io)."""
    names = (ImageRef.parse(r).registry for r in (*PAUSE_IMAGES, SMOKE_IMAGE))
    return tuple(sorted(set(names)))


def push_images(host: str, images: Mapping[str, BuiltImage]) -> None:
    """Push each image to the registry at host under its repository and tag."""
    for reference, image in images.items():
        ref = ImageRef.parse(reference)
        for blob in (image.layer, image.config):
            _push_blob(host, ref.repository, blob)
        url = f"http://{host}/v2/{ref.repository}/manifests/{ref.tag}"
        _request("PUT", url, image.manifest, MANIFEST_TYPE)


class _DebFiles:
    """Files out of the .debs of one apt cache, by package and file name."""

    def __init__(self, archives: Path) -> None:
        self._archives = archives
        self._members: dict[str, dict[str, bytes]] = {}

    def file(self, package: str, suffix: str) -> bytes:
        """The one regular file of the package whose path ends in /suffix."""
        members = self._members.get(package)
        if members is None:
            members = self._members[package] = self._read(package)
        found = [data for path, data in members.items() if path.endswith(f"/{suffix}")]
        if len(found) != 1:
            raise ImagePushFailed(
                f"{package} in {self._archives} has {len(found)} files */{suffix}, not one"
            )
        return found[0]

    def _read(self, package: str) -> dict[str, bytes]:
        debs = sorted(self._archives.glob(f"{package}_*.deb"))
        if not debs:
            raise ImagePushFailed(
                f"no {package} package in {self._archives}: the lab node image's apt cache "
                "is incomplete; remove the image directory so `rollout lab up` rebuilds it"
            )
        argv = ["dpkg-deb", "--fsys-tarfile", str(debs[-1])]
        result = subprocess.run(argv, capture_output=True, timeout=DEB_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise ImagePushFailed(f"{' '.join(argv)} failed: {result.stderr.decode()[-300:]}")
        found: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:") as archive:
            for member in archive.getmembers():
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    found[member.name] = extracted.read()
        return found


def _build_image(
    files: Mapping[str, bytes], config: Mapping[str, object], links: Mapping[str, str] = {}
) -> BuiltImage:
    tar = _layer_tar(files, links)
    layer = gzip.compress(tar, mtime=0)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [PATH_ENV], **config},
        "rootfs": {"type": "layers", "diff_ids": [_digest(tar)]},
    }
    config_blob = json.dumps(image_config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": CONFIG_TYPE,
            "size": len(config_blob),
            "digest": _digest(config_blob),
        },
        "layers": [{"mediaType": LAYER_TYPE, "size": len(layer), "digest": _digest(layer)}],
    }
    return BuiltImage(layer, config_blob, json.dumps(manifest, sort_keys=True).encode())


def _layer_tar(files: Mapping[str, bytes], links: Mapping[str, str]) -> bytes:
    """A merged-/usr root: /bin, /lib and /lib64 lead into /usr, as on Debian."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        directories = sorted({"etc", "tmp", "usr/lib64", *(_parents(p) for p in files)})
        for directory in directories:
            _add(archive, directory, tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755)
        symlinks = {
            "bin": "usr/bin",
            "sbin": "usr/sbin",
            "lib": "usr/lib",
            "lib64": "usr/lib64",
            f"usr/lib64/{LOADER}": f"../lib/x86_64-linux-gnu/{LOADER}",
            **links,
        }
        for path, target in sorted(symlinks.items()):
            _add(archive, path, tarfile.SYMTYPE, target=target)
        for path, data in sorted(files.items()):
            _add(archive, path, tarfile.REGTYPE, data=data, mode=0o755)
    return buffer.getvalue()


def _parents(path: str) -> str:
    return str(Path(path).parent)


def _add(
    archive: tarfile.TarFile,
    path: str,
    kind: bytes,
    *,
    data: bytes = b"",
    mode: int = 0o755,
    target: str = "",
) -> None:
    info = tarfile.TarInfo(path)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, target
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data) if data else None)


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _push_blob(host: str, repository: str, blob: bytes) -> None:
    digest = _digest(blob)
    if _request("HEAD", f"http://{host}/v2/{repository}/blobs/{digest}", ok=(200, 404)) == 200:
        return
    response = _open("POST", f"http://{host}/v2/{repository}/blobs/uploads/", b"", None)
    location = response.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    separator = "&" if "?" in location else "?"
    _request("PUT", f"{location}{separator}digest={digest}", blob, "application/octet-stream")


def _request(
    method: str,
    url: str,
    body: bytes | None = None,
    content_type: str | None = None,
    ok: Sequence[int] = (200, 201, 202),
) -> int:
    try:
        return _open(method, url, body, content_type).status
    except urllib.error.HTTPError as error:
        if error.code in ok:
            return error.code
        detail = error.read()[:300].decode(errors="replace")
        raise ImagePushFailed(f"{method} {url}: HTTP {error.code} {detail}") from error


def _open(method: str, url: str, body: bytes | None, content_type: str | None) -> _Response:
    request = urllib.request.Request(url, data=body, method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=PUSH_TIMEOUT_S) as response:
            return _Response(response.status, dict(response.headers))
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as error:
        raise ImagePushFailed(f"{method} {url}: {error}") from error


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Mapping[str, str]
