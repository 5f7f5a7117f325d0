"""A module of rollout/ is short enough to read in one sitting, or says on its first lines why not.

The rule (outside rollout/lab/, the lab's stand-ins for real servers): at most MAX_LINES lines,
unless one of the first MARKER_LINES lines is a comment `# long module: <reason>` giving a
reason in words. A module that needs a table of contents is a package.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rollout

PACKAGE = Path(rollout.__file__).resolve().parent
MAX_LINES = 450
MARKER_LINES = 3
MARKER = re.compile(r"^# long module: (?P<reason>.*\w.*)$")
EXEMPT = ("lab/",)


def long_module_reason(text: str) -> str | None:
    """The reason a module gives for its length on its first lines, or None."""
    for line in text.splitlines()[:MARKER_LINES]:
        found = MARKER.match(line.strip())
        if found:
            return found.group("reason").strip()
    return None


def size_problem(relative: str, text: str) -> str | None:
    """Why the module at `relative` (below rollout/) breaks the rule, or None."""
    if relative.startswith(EXEMPT):
        return None
    count = len(text.splitlines())
    if count <= MAX_LINES or long_module_reason(text):
        return None
    return (
        f"rollout/{relative} has {count} lines (more than {MAX_LINES}): split it by job, or "
        f"say why it is one job on one of its first {MARKER_LINES} lines: "
        "`# long module: <reason>`"
    )


MODULES = sorted(PACKAGE.rglob("*.py"))
CHECKED = [p for p in MODULES if not p.relative_to(PACKAGE).as_posix().startswith(EXEMPT)]


@pytest.mark.parametrize("module", CHECKED, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_module_is_short_or_says_why(module: Path) -> None:
    problem = size_problem(module.relative_to(PACKAGE).as_posix(), module.read_text())
    assert problem is None, problem


def test_every_module_outside_the_lab_is_checked() -> None:
    checked = {p.relative_to(PACKAGE).as_posix() for p in CHECKED}
    assert {"cli/render.py", "transports/ssh.py", "inputs/yamlsource.py", "__init__.py"} <= checked
    assert not any(name.startswith("lab/") for name in checked)
    lab = [p for p in MODULES if p.relative_to(PACKAGE).parts[0] == "lab"]
    assert lab and len(CHECKED) + len(lab) == len(MODULES)


def lines(count: int, head: str = "") -> str:
    body = "".join(f"x{i} = {i}\n" for i in range(count - head.count("\n")))
    return head + body


def test_a_long_module_without_a_reason_is_caught() -> None:
    problem = size_problem("planner.py", lines(MAX_LINES + 1, '"""Plans."""\n'))
    assert problem is not None
    assert "rollout/planner.py has 451 lines" in problem and "# long module:" in problem


def test_a_module_at_the_limit_passes() -> None:
    assert size_problem("planner.py", lines(MAX_LINES)) is None


def test_a_reason_on_the_first_lines_lets_a_long_module_pass() -> None:
    head = '# long module: one client class, one method per API operation\n"""The client."""\n'
    assert size_problem("transports/kube/client.py", lines(900, head)) is None
    third = '"""The client."""\n\n# long module: one state machine\n'
    assert size_problem("executor.py", lines(900, third)) is None


@pytest.mark.parametrize(
    "head",
    [
        '"""Doc."""\n\n\n# long module: too late, on line 4\n',  # not on the first lines
        "# long module:\n",  # no reason
        "# long module:   \n",  # no reason
        "# long module: -\n",  # no words
        "# a long module: wrong marker\n",
        '"""# long module: inside the docstring, not a comment"""\n',
    ],
)
def test_a_reason_must_be_a_marker_comment_with_words_on_the_first_lines(head: str) -> None:
    assert size_problem("drain.py", lines(MAX_LINES + 50, head)) is not None


def test_the_lab_is_exempt() -> None:
    assert size_problem("lab/cluster.py", lines(2000)) is None
