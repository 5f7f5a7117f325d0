"""The command line's manners: completion, colour, a mistyped command, an option of another
command, an unknown --context, the exit statuses in --help, diagnose's schema_version."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout.cli import main
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "examples" / "plan.yaml"
FACTS = REPO / "examples" / "facts"
ESC = "\x1b["

# what bash hands a completion function for the line typed so far, then what it offers
COMPLETE_LINE = """\
source "$1"
read -ra COMP_WORDS <<< "$2"
[[ "$2" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$2"
COMP_POINT=${#2}
_shtab_rollout
printf '%s\\n' "${COMPREPLY[@]}"
"""


def run(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = main(list(words))
    out, err = capsys.readouterr()
    return code, out, err


def shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        require(f"{name} is not installed (scripts/setup --test installs it)")
    assert found is not None
    return found


@pytest.fixture
def bash_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, out, _ = run(capsys, "completion", "bash")
    assert code == 0
    path = tmp_path / "rollout.bash"
    path.write_text(out, encoding="utf-8")
    return path


def complete(script: Path, line: str, cwd: Path) -> list[str]:
    """What a real bash offers for `line` (the cursor at its end) with the script loaded."""
    done = subprocess.run(
        [shell("bash"), "--norc", "-c", COMPLETE_LINE, "complete", str(script), line],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


def test_bash_completes_commands_lab_commands_options_and_files(
    bash_script: Path, tmp_path: Path
) -> None:
    (tmp_path / "plan.yaml").write_text("", encoding="utf-8")
    assert complete(bash_script, "rollout pl", tmp_path) == ["plan"]
    options = complete(bash_script, "rollout plan --", tmp_path)
    assert {"--facts", "--inventory", "--out", "--no-color", "--detailed-exitcode"} <= set(options)
    assert "--yes" not in options  # apply's, not plan's
    assert complete(bash_script, "rollout lab u", tmp_path) == ["up"]
    assert "--containerd" in complete(bash_script, "rollout lab up --c", tmp_path)
    assert complete(bash_script, "rollout plan --color ", tmp_path) == ["auto", "always", "never"]
    assert complete(bash_script, "rollout plan pl", tmp_path) == ["plan.yaml"]
    assert complete(bash_script, "rollout comp", tmp_path) == ["completion"]


def test_zsh_parses_its_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "completion", "zsh")
    assert code == 0 and out.startswith("#compdef rollout")
    assert "\n    plan:'" in out and "\n    lab:'" in out and '"--no-color[' in out
    script = tmp_path / "_rollout"
    script.write_text(out, encoding="utf-8")
    done = subprocess.run(
        [shell("zsh"), "-n", str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_completion_knows_only_bash_and_zsh(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "completion", "fish")
    assert code == 2 and "invalid choice: 'fish'" in err


@pytest.mark.parametrize(
    ("env", "options", "coloured"),
    [
        ({}, [], True),
        ({"NO_COLOR": "1"}, [], False),
        ({"NO_COLOR": ""}, [], True),  # set but empty: no-color.org says it does not count
        ({"NO_COLOR": "1"}, ["--color", "always"], True),  # the command line wins
        ({}, ["--no-color"], False),
        ({}, ["--color", "never"], False),
        ({}, ["--no-color", "--color", "always"], True),  # the last one given
    ],
)
def test_colour_follows_no_color_and_the_command_line(
    env: dict[str, str],
    options: list[str],
    coloured: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # FORCE_COLOR makes the captured stream a terminal to rich: "auto" would colour it
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "plan", str(PLAN), "--facts", str(FACTS), *options)
    assert code == 0
    assert (ESC in out) is coloured
    code, out, _ = run(capsys, "diagnose", "--facts", str(FACTS), *options)
    assert code == 1  # the example fleet has a broken node
    assert (ESC in out) is coloured


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["plna"], "unknown command 'plna'; did you mean 'plan'?"),
        (["plna", "plan.yaml", "--facts", "f"], "unknown command 'plna'; did you mean 'plan'?"),
        (["--debug", "aply"], "unknown command 'aply'; did you mean 'apply'?"),
        (["lab", "upp"], "unknown command 'lab upp'; did you mean 'lab up'?"),
        (["lab", "--help-me", "donw"], "unknown command 'lab donw'; did you mean 'lab down'?"),
        (["facts", "recrod"], "unknown command 'facts recrod'; did you mean 'facts record'?"),
        (
            ["zzz"],
            "unknown command 'zzz'; the commands of rollout are: apply, completion, diagnose, "
            "facts, init, lab, pause, plan, resume, schedule, show, status, unpause, version",
        ),
    ],
)
def test_a_mistyped_command_names_the_nearest(
    words: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *words)
    assert (code, out) == (2, "")
    assert err == f"rollout: error: {message}\n"


def test_a_mistyped_command_with_detailed_exitcode_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "paln", str(PLAN), "--detailed-exitcode")
    assert code == 1 and "did you mean 'plan'?" in err


def test_a_mistyped_command_prints_controls_not_acting_on_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "pl\x1b[2Jan")
    assert code == 2 and "\x1b" not in err and "did you mean 'plan'?" in err


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (
            ["apply", str(PLAN), "--dry-run"],
            "apply has no --dry-run: `rollout plan PLAN -i INV` shows what apply would do",
        ),
        (
            ["apply", "--dry-run=client", str(PLAN)],
            "apply has no --dry-run: `rollout plan PLAN -i INV` shows what apply would do",
        ),
        (
            ["apply", str(PLAN), "--facts", str(FACTS)],
            "apply has no --facts: it reads the nodes themselves; "
            "`rollout plan PLAN --facts DIR` plans from recorded facts",
        ),
    ],
)
def test_apply_points_to_plan(
    words: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *words)
    assert (code, out, err) == (2, "", f"rollout: error: {message}\n")


def test_apply_lists_no_dry_run_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "apply", "--help")
    assert code == 0
    assert "--dry-run" not in out and "--facts" not in out


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "http://127.0.0.1:9"}
users:
- name: operator
  user: {token: not-a-secret}
contexts:
- name: lab
  context: {cluster: lab, user: operator}
- name: prod-eu
  context: {cluster: lab, user: operator}
current-context: lab
"""


def test_an_unknown_context_lists_the_contexts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(KUBECONFIG, encoding="utf-8")
    words = ["status", "--schedule", str(PLAN), "--kubeconfig", str(kubeconfig)]
    code, _, err = run(capsys, *words, "--context", "prdo-eu")
    assert code == 2
    assert f"kubeconfig {kubeconfig}: no context 'prdo-eu'; its contexts: lab, prod-eu\n" in err


def test_help_lists_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    statuses = out.split("exit statuses:\n", 1)[1]
    listed = [line.split()[0] for line in statuses.splitlines() if line[:4].strip().isdigit()]
    assert listed == ["0", "1", "2", "3", "4", "5", "141"]
    assert "maintenance window" in statuses and "rollout pause" in statuses


def test_diagnose_json_carries_its_schema_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "diagnose", "--facts", str(FACTS), "-o", "json")
    assert code == 1
    assert json.loads(out)["schema_version"] == 1
    documented = (REPO / "docs" / "diagnose.md").read_text(encoding="utf-8")
    assert '"schema_version": 1' in documented and "| `schema_version` | int |" in documented


@pytest.mark.parametrize("output", ["text", "json", "markdown"])
def test_a_closed_output_pipe_ends_quietly_with_sigpipes_status(output: str) -> None:
    """`rollout plan | head -1`: the reader is gone before rollout writes; the run says
    nothing on stderr and exits 141 (a SIGPIPE death's status), not 1 (a failure) as rich's
    own handler made it, nor an internal error."""
    import os
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rollout", "plan", str(PLAN), "--facts", str(FACTS),
             "-o", output],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_broken_pipe_elsewhere_is_still_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken socket (not the output) is no reader gone: it is reported as the bug it is."""
    import rollout.cli.plan as plan_cli

    def broken(*_: object) -> int:
        raise BrokenPipeError("a socket's peer went away")

    monkeypatch.setattr(plan_cli, "run_plan", broken)
    code, _, err = run(capsys, "plan", str(PLAN), "--facts", str(FACTS))
    assert code == 1
    assert "internal error: BrokenPipeError" in err
