"""Table-driven hostile-input cases: run `rollout.cli.main` on bad input and check the contract.

The contract (docs/input-contract.md): bad input of any kind gives one message per problem
naming the file (and line, where the input has lines), what was found and what is allowed;
exit 2 (1 with `--detailed-exitcode`); nothing is changed anywhere; never a traceback.

A case is data: the files to create in a fresh working directory (text or bytes, or a
`setup` callable for FIFOs, links and the like), the command line, and what stderr must say.
`run_case` runs it in-process with the working directory, $HOME and $ROLLOUT_STATE_DIR all
inside pytest's tmp_path, snapshots that whole tree before and after, and asserts:
- the exit code (and, for `rollout plan`, 1 again with `--detailed-exitcode`);
- no "Traceback" anywhere in stdout or stderr;
- stderr names `where` ("plan.yaml:3", or "plan.yaml" for input without lines), and each
  string of `says`;
- exactly `problems` lines of stderr start with the file name `where` names (one message per
  problem), when `problems` is set;
- nothing under tmp_path was created, changed or removed;
- the case finished within `max_s` seconds (a bomb is refused by its limit, not by patience);
- stderr stays under `max_stderr` characters and holds no raw escape character.

Usage in a test module:

    CASES = [HostileCase("nul-byte", files={"plan.yaml": b"a: \\x00"}, argv=["plan", "plan.yaml",
             "--facts", FACTS], where="plan.yaml:1", says=("NUL",)), ...]

    test_hostile = hostile_test(CASES)  # one test per case, named by its id

`run_case` serves a test that runs one case of its own and checks more.

`{repo}` in argv is replaced by the repository root, `{tmp}` by the working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import rollout.cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_FACTS = str(REPO / "examples" / "facts")
EXAMPLE_PLAN = str(REPO / "examples" / "plan.yaml")

# A plan that loads cleanly: cases start from it and break one thing.
GOOD_PLAN = """\
apiVersion: rollout/v1
kind: Plan
metadata:
  name: mirror
targets:
  selector: nvidia.com/gpu.present=true
changes:
  - registry:
      host: docker.io
      endpoints:
        - url: https://mirror.registry.internal:5000
"""


@dataclass(frozen=True)
class HostileCase:
    """One bad input and what rollout must say about it."""

    id: str
    argv: Sequence[str]
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    exit_code: int = 2
    # "plan.yaml:7" (file and line) or "plan.yaml" (input without lines); None: no file named
    where: str | None = None
    says: Sequence[str] = ()
    problems: int | None = None
    # a guard against a bomb (an input that expands without bound takes minutes), not a speed
    # target: speed is measured by bench/, and CI runs three test processes on two cores
    max_s: float = 30.0
    # hostile input must not become hostile output: a 100 KiB key is not echoed whole
    max_stderr: int = 20_000
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CaseResult:
    code: int
    stdout: str
    stderr: str
    elapsed_s: float


def case_id(case: HostileCase) -> str:
    return case.id


def hostile_test(
    cases: Sequence[HostileCase],
) -> Callable[[HostileCase, Path, pytest.MonkeyPatch], None]:
    """A test function that runs each of `cases` (run_case), parametrised by the case's id."""

    @pytest.mark.parametrize("case", cases, ids=case_id)
    def test_case(case: HostileCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        run_case(case, tmp_path, monkeypatch)

    return test_case


def run_case(case: HostileCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CaseResult:
    """Run one case and assert the whole contract; returns what happened for extra checks."""
    work = tmp_path / "work"
    home = tmp_path / "home"
    state = tmp_path / "state"
    for folder in (work, home, state):
        folder.mkdir()
    for name, content in case.files.items():
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
    if case.setup is not None:
        case.setup(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(state))
    monkeypatch.setenv("KUBECONFIG", str(home / "no-kubeconfig"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    argv = [a.replace("{repo}", str(REPO)).replace("{tmp}", str(work)) for a in case.argv]

    before = snapshot(tmp_path)
    result = invoke(argv)
    check_result(case, result, case.exit_code)
    if argv and argv[0] == "plan" and case.exit_code == 2 and "--detailed-exitcode" not in argv:
        # with --detailed-exitcode 2 means "changes pending": bad input must exit 1 instead
        check_result(case, invoke([*argv, "--detailed-exitcode"]), 1)
    after = snapshot(tmp_path)
    assert after == before, f"the case changed files: {describe_changes(before, after)}"
    return result


def invoke(argv: Sequence[str]) -> CaseResult:
    """rollout.cli.main(argv) with stdout and stderr captured; SystemExit becomes its code."""
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = rollout.cli.main(list(argv))
        except SystemExit as exc:  # argparse's own errors, --help
            code = exc.code if isinstance(exc.code, int) else 1
    return CaseResult(code, out.getvalue(), err.getvalue(), time.monotonic() - started)


def check_result(case: HostileCase, result: CaseResult, expected_code: int) -> None:
    shown = f"\n--- stderr ---\n{result.stderr}\n--- stdout ---\n{result.stdout[-2000:]}"
    assert "Traceback" not in result.stderr + result.stdout, f"a traceback was shown{shown}"
    assert result.code == expected_code, f"exit {result.code}, expected {expected_code}{shown}"
    assert result.elapsed_s < case.max_s, f"took {result.elapsed_s:.2f}s (limit {case.max_s}s)"
    assert len(result.stderr) <= case.max_stderr, f"{len(result.stderr)} characters of stderr"
    assert "\x1b" not in result.stderr, f"a raw escape character reached the terminal{shown}"
    if case.where is not None:
        assert case.where in result.stderr, f"stderr does not name {case.where!r}{shown}"
    for text in case.says:
        assert text.lower() in result.stderr.lower(), f"stderr does not say {text!r}{shown}"
    if case.problems is not None:
        assert case.where is not None, "`problems` counts lines naming `where`'s file"
        file_name = case.where.split(":")[0]
        naming = [
            line
            for line in result.stderr.splitlines()
            if line.removeprefix("error: ").startswith(file_name)
        ]
        assert len(naming) == case.problems, (
            f"{len(naming)} message(s) name {file_name}, expected {case.problems}{shown}"
        )


Snapshot = dict[str, tuple[str, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every entry under root: its kind, mode and (for regular files) content digest."""
    entries: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            info = path.lstat()
            digest = ""
            if stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                digest = os.readlink(path)
            kind = stat.filemode(info.st_mode)
            entries[str(path.relative_to(root))] = (kind, info.st_size if digest else 0, digest)
    return entries


def describe_changes(before: Snapshot, after: Snapshot) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return f"added {added}, removed {removed}, changed {changed}"


def make_fifo(name: str) -> Callable[[Path], None]:
    """A setup that makes a named pipe (reading it would block forever)."""

    def setup(work: Path) -> None:
        os.mkfifo(work / name)

    return setup


def make_symlink(name: str, target: str) -> Callable[[Path], None]:
    """A setup that makes `name` a symbolic link to `target` (e.g. /dev/zero)."""

    def setup(work: Path) -> None:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).symlink_to(target)

    return setup
