"""Whole numbers read from text rollout did not write: ASCII digits only, never a crash."""

from __future__ import annotations

import pytest

from rollout.changes.containerd.registrymodel import check_registry_host
from rollout.containerd.errors import VersionUnknown
from rollout.containerd.version import ContainerdVersion
from rollout.driver.modules import parse_lsmod
from rollout.inputs.fieldproblems import FieldProblem
from rollout.inputs.wholenumber import whole_number
from rollout.transports.errors import split_known_hosts_entry


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0", 0),
        ("22", 22),
        ("0042", 42),
        ("", None),
        ("²", None),
        ("١٢", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1_000", None),
        ("1.0", None),
        ("0x10", None),
    ],
)
def test_only_ascii_digits_spell_a_number(text: str, number: int | None) -> None:
    assert whole_number(text) == number


def test_a_digit_sign_is_refused_where_a_number_is_read_not_a_crash() -> None:
    with pytest.raises(VersionUnknown):
        ContainerdVersion.from_series("1.²")
    with pytest.raises(FieldProblem, match="is not a number from 1 to 65535"):
        check_registry_host("mirror.internal:²")
    assert split_known_hosts_entry("[gpu1]:²") == ("[gpu1]:²", 22)
    assert parse_lsmod("nvidia 1 ²\n") == ()
