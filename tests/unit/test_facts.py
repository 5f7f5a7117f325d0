"""Facts: the recorded layout (examples/facts and every way a directory can be wrong), and
each fact object's command and parser."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rollout.commands import CommandFailed, CommandResult
from rollout.containerd import StagingFailed, dump_command, parse_version
from rollout.driver.host import (
    AptVersionsFact,
    DriverVersionFact,
    HeldPackagesFact,
    InstalledPackagesFact,
    SecureBootFact,
)
from rollout.driver.modules import BootIdFact, GpuClientsFact, LoadedModulesFact
from rollout.driver.status import DriverKernelFact, DriverStatusFact
from rollout.errors import InputError, InputErrors
from rollout.fact import Fact
from rollout.facts import (
    ConfigDumpFact,
    ConfigFilesFact,
    ContainerdChanged,
    ContainerdVersionFact,
    GpuFacts,
    GpuQueryFact,
    ProbeFailed,
    ServiceFact,
    ServiceProbeFailed,
    check_containerd_version,
    load_recorded_facts,
    read_fact,
)
from rollout.facts.containerd import ConfigMtimesFact
from rollout.facts.kernel import KernelXidFact
from rollout.facts.service import SHOW_PROPERTIES, ServiceJournalFact

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "facts"


def write_node(root: Path, name: str, node_yaml: str, files: dict[str, str]) -> Path:
    node = root / name
    node.mkdir(parents=True)
    (node / "node.yaml").write_text(node_yaml)
    for path, text in files.items():
        target = node / "files" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return node


def version_line(release: str = "1.7.24") -> str:
    """node.yaml's containerd_version as `containerd --version` prints it for `release`."""
    return f"containerd_version: containerd github.com/containerd/containerd {release} x\n"


# the smallest main config a recorded node can have
MAIN_CONFIG = {"/etc/containerd/config.toml": "version = 2\n"}


def facts_errors(root: Path) -> list[InputError]:
    """The problems load_recorded_facts reports for a directory (all of them, at once)."""
    with pytest.raises(InputErrors) as info:
        load_recorded_facts(root)
    return info.value.errors


def test_examples_load_with_versions_and_files() -> None:
    fleet = load_recorded_facts(EXAMPLES)
    assert [n.name for n in fleet.nodes] == ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"]
    series = {n.name: n.containerd.series for n in fleet.nodes}
    assert series == {"gpu-a-1": "1.6", "gpu-a-2": "1.7", "gpu-a-3": "1.7", "gpu-b-1": "2.1"}
    broken = fleet.by_name("gpu-a-3")
    assert broken is not None
    assert "/etc/containerd/conf.d/registry.toml" in broken.config_files.files
    assert broken.config_files.main_path == "/etc/containerd/config.toml"
    assert broken.gpus.count == 4 and len(broken.gpus.uuids) == 4


def test_missing_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="facts directory not found"):
        load_recorded_facts(tmp_path / "nope")


def test_directory_without_nodes_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no node facts"):
        load_recorded_facts(tmp_path)


def test_a_node_is_a_directory_with_anything_named_node_yaml(tmp_path: Path) -> None:
    """A sub-directory without node.yaml is not a node; one whose node.yaml is a dangling link
    or a directory is, and is refused naming its node.yaml."""
    write_node(tmp_path, "n1", version_line(), MAIN_CONFIG)
    (tmp_path / "notes" / "files").mkdir(parents=True)
    (tmp_path / "stray.yaml").write_text("name: stray\n")
    (tmp_path / "n2").mkdir()
    (tmp_path / "n2" / "node.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (tmp_path / "n3" / "node.yaml").mkdir(parents=True)
    dangling, directory = facts_errors(tmp_path)
    assert str(dangling.location) == str(tmp_path / "n2" / "node.yaml")
    assert "file not found" in str(dangling)
    assert str(directory.location) == str(tmp_path / "n3" / "node.yaml")
    assert "not a regular file" in str(directory)


@pytest.mark.parametrize("spelling", [".", "fleet", "fleet/", "./fleet", "ABSOLUTE"])
def test_paths_read_as_pathlib_writes_them(
    spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node paths are joined as strings: the same text pathlib gives, however the directory
    is spelled (recorded_at, and the file an error names)."""
    fleet = tmp_path / "fleet"
    write_node(fleet, "n1", version_line(), MAIN_CONFIG)
    write_node(fleet, "n2", version_line(), {})
    monkeypatch.chdir(fleet if spelling == "." else tmp_path)
    directory = fleet if spelling == "ABSOLUTE" else Path(spelling)
    (error,) = facts_errors(directory)
    assert error.location.path == str(directory / "n2" / "node.yaml")
    assert f"under {directory / 'n2' / 'files'}/etc/containerd/config.toml" in str(error)
    (fleet / "n2" / "node.yaml").unlink()
    (node,) = load_recorded_facts(directory).nodes
    assert node.recorded_at == str(directory / "n1")


def test_missing_version_names_the_field(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", "name: n1\n", MAIN_CONFIG)
    (error,) = facts_errors(tmp_path)
    assert error.field == "containerd_version"
    assert str(error).startswith(str(tmp_path / "n1" / "node.yaml"))


def test_missing_main_config_says_where_to_put_it(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", version_line(), {})
    (error,) = facts_errors(tmp_path)
    assert "/etc/containerd/config.toml is not among" in str(error)


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", version_line() + "labelz: {}\n", MAIN_CONFIG)
    (error,) = facts_errors(tmp_path)
    assert "unknown key 'labelz'" in str(error)


def test_yaml_error_carries_line_and_column(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", "name: n1\nlabels: {a: [}\n", {})
    (error,) = facts_errors(tmp_path)
    assert error.location.line == 2


def test_cordoned_node_is_unavailable(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", version_line() + "unschedulable: true\n", MAIN_CONFIG)
    (node,) = load_recorded_facts(tmp_path).nodes
    assert not node.available


def test_unsupported_recorded_version_names_the_file_and_field(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", version_line("1.4.13"), MAIN_CONFIG)
    (error,) = facts_errors(tmp_path)
    assert "1.4.13 is not supported" in str(error)
    assert error.field == "containerd_version"


# --- the fact objects: one command and one pure parser each ---------------------------------


@dataclass
class OneReply:
    """A runner that answers every command with one result and records the argv."""

    exit_code: int
    stdout: str
    calls: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def host(self) -> str:
        return "gpu-1"

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float = 60.0
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), self.exit_code, self.stdout, "boom", self.host)


def test_version_fact_reads_and_parses_containerd_version() -> None:
    runner = OneReply(0, "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1\n")
    version = read_fact(runner, ContainerdVersionFact())
    assert str(version) == "1.6.20" and runner.calls == [("containerd", "--version")]


def test_a_required_fact_that_fails_names_what_it_read() -> None:
    with pytest.raises(CommandFailed, match="read the containerd version"):
        read_fact(OneReply(127, ""), ContainerdVersionFact())


def test_the_gpu_fact_is_optional_a_node_without_nvidia_smi_has_no_gpus() -> None:
    assert read_fact(OneReply(127, "GPU-1, x, 1\n"), GpuQueryFact()) == GpuFacts(count=0)
    gpus = read_fact(OneReply(0, "GPU-aa-bb, NVIDIA A100, 535.1\n"), GpuQueryFact())
    assert gpus == GpuFacts(1, "NVIDIA A100", ("GPU-aa-bb",), "535.1")


def test_the_dump_fact_is_the_engine_dump_command_and_drops_imports() -> None:
    fact = ConfigDumpFact("/etc/containerd/config.toml")
    assert fact.command() == dump_command("containerd", "/etc/containerd/config.toml")
    assert fact.command()[4] == "/", "run from / as systemd runs containerd"
    tree = fact.parse('version = 2\nimports = ["/etc/containerd/conf.d/a.toml"]\n', "gpu-1")
    assert tree == {"version": 2}
    with pytest.raises(StagingFailed, match="on gpu-1 printed invalid TOML"):
        fact.parse("version = = 2", "gpu-1")


def test_the_files_fact_needs_the_main_config() -> None:
    fact = ConfigFilesFact("/etc/containerd/config.toml")
    assert fact.command()[:2] == ["find", "/etc/containerd"]
    listing = "/etc/containerd/config.toml\0version = 2\n\0/etc/containerd/conf.d/a.toml\0\0"
    files = fact.parse(listing, "gpu-1")
    assert files.main_path == "/etc/containerd/config.toml"
    assert list(files.files) == ["/etc/containerd/conf.d/a.toml", "/etc/containerd/config.toml"]
    with pytest.raises(ProbeFailed, match=r"gpu-1: /etc/containerd/config\.toml not found"):
        fact.parse("/etc/containerd/other.toml\0x\0", "gpu-1")


def test_the_service_fact_asks_for_what_its_parser_needs() -> None:
    fact = ServiceFact()
    argv = fact.command()
    asked = {argv[i + 1] for i, word in enumerate(argv) if word == "-p"}
    assert asked == set(SHOW_PROPERTIES)
    with pytest.raises(ServiceProbeFailed, match=r"gpu-1: containerd\.service: .*printed no"):
        fact.parse("Unit containerd.service could not be found.\n", "gpu-1")


def test_a_restart_count_of_other_digits_than_ascii_is_unknown() -> None:
    """str.isdigit() accepts '²', which int() refuses: a count only of ASCII digits."""
    state = ServiceFact().parse(
        "MainPID=9\nActiveState=active\nSubState=running\nNRestarts=²\n", ""
    )
    assert state.n_restarts is None


@pytest.mark.parametrize(
    ("planned", "found", "refused"),
    [
        ("1.7.24", "containerd containerd.io 1.7.24 abc", False),
        ("1.7.24", "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-2", False),
        ("1.7.24", "containerd containerd.io 1.7.25 abc", True),
        ("1.7.24", "containerd github.com/containerd/containerd/v2 2.1.9+unknown", True),
    ],
)
def test_the_one_version_check_names_both_versions(planned: str, found: str, refused: bool) -> None:
    version = parse_version(found)
    if not refused:
        check_containerd_version(planned, version)
        return
    with pytest.raises(ContainerdChanged) as info:
        check_containerd_version(planned, version)
    assert f"{version} now, {planned} planned" in str(info.value)


def test_a_plan_without_a_usable_version_is_refused() -> None:
    with pytest.raises(ContainerdChanged, match="no usable containerd version"):
        check_containerd_version("", parse_version("containerd containerd.io 1.7.24 abc"))


def every_fact() -> list[Fact[object]]:
    """One of each fact of the package, as the probes and steps build them."""
    return [
        ContainerdVersionFact(),
        ConfigFilesFact(),
        ConfigDumpFact(),
        ConfigMtimesFact(),
        ServiceFact(),
        ServiceJournalFact(),
        GpuQueryFact(),
        KernelXidFact(),
        DriverStatusFact(),
        DriverKernelFact(),
        DriverVersionFact(),
        InstalledPackagesFact(("nvidia-driver-550",)),
        HeldPackagesFact(),
        AptVersionsFact(("nvidia-driver-550",)),
        SecureBootFact(),
        GpuClientsFact(),
        LoadedModulesFact(),
        BootIdFact(),
    ]


@pytest.mark.parametrize("fact", every_fact(), ids=lambda fact: type(fact).__name__)
def test_every_fact_states_a_sentence_and_a_command(fact: Fact[object]) -> None:
    assert fact.what and "{" not in fact.what
    argv = fact.command()
    assert argv and all(isinstance(word, str) and word for word in argv[:3])


def test_a_sentence_names_the_facts_own_fields() -> None:
    assert ServiceFact("kubelet").what == "read the state of kubelet.service"
    assert ConfigFilesFact(directory="/srv/cd").what == "read /srv/cd"
    assert ConfigDumpFact("/a/b.toml").what == "containerd config dump of /a/b.toml"


def test_a_script_fact_runs_its_script_in_sh_with_its_packages_as_arguments() -> None:
    assert KernelXidFact().command()[:2] == ["sh", "-c"]
    argv = AptVersionsFact(("a", "b c")).command()
    assert argv == ["sh", "-c", 'apt-cache madison "$@" 2>&1; true', "sh", "a", "b c"]
    assert InstalledPackagesFact(()).command()[-1] == "sh", "no packages: an empty $@"


def test_only_the_facts_a_plan_cannot_do_without_are_required() -> None:
    required = {type(f).__name__ for f in every_fact() if not f.optional}
    assert required == {
        "ContainerdVersionFact",
        "ConfigFilesFact",
        "ConfigDumpFact",
        "ServiceFact",
        "BootIdFact",
    }
