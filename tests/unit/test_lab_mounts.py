"""The lab's reading of the host's mount table: fields unescaped the kernel's way."""

from __future__ import annotations

from pathlib import Path

from rollout.lab.mounts import Mount


def test_a_mount_line_is_read_with_its_escapes_undone() -> None:
    line = r"overlay /tmp/lab\040dir/nodes/n1/merged overlay rw,lowerdir=/a\134b,upperdir=/u 0 0"
    mount = Mount.from_line(line)
    assert mount == Mount(
        point=Path("/tmp/lab dir/nodes/n1/merged"),
        fstype="overlay",
        options=("rw", "lowerdir=/a\\b", "upperdir=/u"),
    )


def test_tab_and_newline_escapes_are_undone_and_short_lines_are_no_mount() -> None:
    mount = Mount.from_line(r"tmpfs /mnt/a\011b\012c tmpfs rw 0 0")
    assert mount is not None and mount.point == Path("/mnt/a\tb\nc")
    assert Mount.from_line("tmpfs /mnt tmpfs") is None
    assert Mount.from_line("") is None
