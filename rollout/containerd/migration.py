"""containerd 2.x's in-memory migration of version-2 CRI settings to the version-3 plugins.

Config version 3 splits the one CRI plugin `io.containerd.grpc.v1.cri` into
`io.containerd.cri.v1.runtime` (runtimes, CNI, enable_cdi, ...), `io.containerd.cri.v1.images`
(registry, pinned sandbox image, snapshotter, ...) and keeps only the streaming server settings
in `io.containerd.grpc.v1.cri`. Source: the ConfigMigration functions of plugins/cri/runtime
and plugins/cri/images (containerd 2.x). Measured on 2.1.9:

- the migration runs once, on the merged tree, when the merged `version` is below 3; the merged
  version is the last non-zero `version` of the loaded files (mergo overrides with non-zero
  values), so a version-3 file loaded last switches the migration of every v2 key off;
- runtime keys: an existing version-3 key wins over the migrated one (shallow: a v3
  `containerd.runtimes` table hides every v2 runtime); `sandbox_mode` becomes `sandboxer`;
- image keys: the migrated version-2 value wins over an existing version-3 key;
- `containerd.snapshotter`, `.disable_snapshot_annotations`, `.discard_unpacked_layers` move to
  the images plugin only when the merged v2 table has a `containerd.runtimes` table; otherwise
  they are lost (v3 files should set them in the images plugin).

The functions work on any tree whose leaves are opaque values, so the merge model can run them
on trees that carry provenance.
"""

from __future__ import annotations

from typing import Any

from rollout.containerd.version import CRI_IMAGES, CRI_RUNTIME, CRI_V2

# Keys of the v2 CRI table that go to the images plugin, top level and under `containerd`.
IMAGE_KEYS = (
    "registry",
    "image_decryption",
    "max_concurrent_downloads",
    "image_pull_progress_timeout",
    "image_pull_with_sync_fs",
    "stats_collect_period",
)
IMAGE_CONTAINERD_KEYS = ("snapshotter", "disable_snapshot_annotations", "discard_unpacked_layers")
# Keys that stay in io.containerd.grpc.v1.cri: the CRI streaming server.
SERVER_KEYS = (
    "disable_tcp_service",
    "stream_server_address",
    "stream_server_port",
    "stream_idle_timeout",
    "enable_tls_streaming",
    "x509_key_pair_streaming",
)
SANDBOX_IMAGE = "sandbox_image"


def migrate_cri_tables(plugins: dict[str, Any], wrap_list: Any = None) -> None:
    """Migrate the v2 CRI table of `plugins` in place, as containerd 2.x does.

    `wrap_list(leaf)` turns a `cni.bin_dir` leaf into a one-element `bin_dirs` leaf; the default
    wraps a plain value.
    """
    src = plugins.get(CRI_V2)
    if not isinstance(src, dict):
        return
    _migrate_runtime(plugins, src, wrap_list or (lambda leaf: [leaf]))
    _migrate_images(plugins, src)
    # What stays effective in the v2 table is the streaming server; containerd ignores the
    # rest (with a warning), so the effective tree does not show it.
    _keep_server_keys(plugins, src)


def prune_v2_cri_table(plugins: dict[str, Any]) -> list[str]:
    """Drop keys of a v2 CRI table that a version-3 config ignores; return their names."""
    src = plugins.get(CRI_V2)
    if not isinstance(src, dict):
        return []
    ignored = sorted(k for k in src if k not in SERVER_KEYS)
    if ignored:
        _keep_server_keys(plugins, src)
    return ignored


def v3_plugin_of(key: tuple[str, ...]) -> str:
    """The version-3 plugin a version-2 CRI key (relative to the v2 CRI table) moves to."""
    head = key[0] if key else ""
    if head in (SANDBOX_IMAGE, *IMAGE_KEYS) or (
        head == "containerd" and len(key) > 1 and key[1] in IMAGE_CONTAINERD_KEYS
    ):
        return CRI_IMAGES
    return CRI_V2 if head in SERVER_KEYS else CRI_RUNTIME


def _keep_server_keys(plugins: dict[str, Any], src: dict[str, Any]) -> None:
    """The v2 CRI table cut down to its streaming server keys; gone when none is set."""
    server = {k: v for k, v in src.items() if k in SERVER_KEYS}
    if server:
        plugins[CRI_V2] = server
    else:
        del plugins[CRI_V2]


def _migrate_runtime(plugins: dict[str, Any], src: dict[str, Any], wrap_list: Any) -> None:
    existing = plugins.get(CRI_RUNTIME)
    dst: dict[str, Any] = existing if isinstance(existing, dict) else {}
    skipped = {"cni", "containerd", SANDBOX_IMAGE, *IMAGE_KEYS, *SERVER_KEYS}
    for key, value in src.items():
        if key not in skipped and key not in dst:
            dst[key] = value
    cni = src.get("cni")
    if isinstance(cni, dict):
        new_cni = dst.get("cni") if isinstance(dst.get("cni"), dict) else {}
        assert isinstance(new_cni, dict)
        for key, value in cni.items():
            if key == "bin_dir":
                # containerd checks `bin_dirs.([]string)`, which a TOML-decoded array never
                # is, so a v2 bin_dir always replaces bin_dirs.
                new_cni["bin_dirs"] = wrap_list(value)
            elif key not in new_cni:
                new_cni[key] = value
        dst["cni"] = new_cni
    containerd = src.get("containerd")
    if isinstance(containerd, dict):
        new_ctd = dst.get("containerd") if isinstance(dst.get("containerd"), dict) else {}
        assert isinstance(new_ctd, dict)
        for key, value in containerd.items():
            if key not in IMAGE_CONTAINERD_KEYS and key not in new_ctd:
                new_ctd[key] = value
        dst["containerd"] = new_ctd
        runtimes = new_ctd.get("runtimes")
        if isinstance(runtimes, dict):
            for name, runtime in list(runtimes.items()):
                if (
                    isinstance(runtime, dict)
                    and "sandbox_mode" in runtime
                    and "sandboxer" not in runtime
                ):
                    renamed = {k: v for k, v in runtime.items() if k != "sandbox_mode"}
                    renamed["sandboxer"] = runtime["sandbox_mode"]
                    runtimes[name] = renamed
    plugins[CRI_RUNTIME] = dst


def _migrate_images(plugins: dict[str, Any], src: dict[str, Any]) -> None:
    existing = plugins.get(CRI_IMAGES)
    dst: dict[str, Any] = existing if isinstance(existing, dict) else {}
    if SANDBOX_IMAGE in src:
        pinned = dst.get("pinned_images") if isinstance(dst.get("pinned_images"), dict) else {}
        assert isinstance(pinned, dict)
        dst["pinned_images"] = {**pinned, "sandbox": src[SANDBOX_IMAGE]}
    containerd = src.get("containerd")
    # Measured on 2.1.9: these three move only when the v2 table has a `containerd.runtimes`
    # table (even an empty one); otherwise they are lost, as the runtime side skips them.
    if isinstance(containerd, dict) and isinstance(containerd.get("runtimes"), dict):
        for key in IMAGE_CONTAINERD_KEYS:
            if key in containerd:
                dst[key] = containerd[key]
    for key in IMAGE_KEYS:
        if key in src:
            dst[key] = src[key]
    plugins[CRI_IMAGES] = dst
