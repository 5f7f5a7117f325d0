"""Finding the kubeconfig: a missing file and a path that is not a file say different things."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.transports.errors import KubeConfigError
from rollout.transports.kube.config import load_kubeconfig


def test_a_missing_kubeconfig_is_named_missing(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no such file"):
        load_kubeconfig(str(tmp_path / "absent"))


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "."], ids=["zero", "null", "dir"])
def test_a_kubeconfig_that_is_not_a_file_is_not_called_missing(path: str) -> None:
    with pytest.raises(KubeConfigError) as caught:
        load_kubeconfig(path)
    assert "not a regular file" in str(caught.value)
    assert "no such file" not in str(caught.value)
