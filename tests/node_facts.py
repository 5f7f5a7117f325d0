"""Node facts the suites build by hand: a GPU node's containerd and its one config file."""

from __future__ import annotations

from rollout.containerd import ConfigFiles, ContainerdVersion
from rollout.facts import NodeFacts

CONFIG_TOML = "/etc/containerd/config.toml"


def containerd_node(name: str, config: str = "version = 2\n") -> NodeFacts:
    """A node running containerd 1.7.24 with `config` as its only file; `replace` adds the rest."""
    return NodeFacts(
        name=name,
        containerd=ContainerdVersion.from_series("1.7.24"),
        config_files=ConfigFiles(main_path=CONFIG_TOML, files={CONFIG_TOML: config}),
    )
