"""The lab's slow link: what rollout.lab.linkshaper asks of tc, with tc's answers scripted."""

from __future__ import annotations

import logging
import subprocess

import pytest

from rollout.lab import linkshaper

ADDRESS = "127.0.58.3"


def scripted_tc(
    monkeypatch: pytest.MonkeyPatch, answers: dict[str, tuple[int, str, str]]
) -> list[tuple[str, ...]]:
    """Replace tc: each call's words are kept; the answer is the first whose key starts them."""
    calls: list[tuple[str, ...]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        words = tuple(argv[1:])
        calls.append(words)
        text = " ".join(words)
        code, out, err = next((a for k, a in answers.items() if text.startswith(k)), (0, "", ""))
        return subprocess.CompletedProcess(argv, code, out, err)

    monkeypatch.setattr(linkshaper.subprocess, "run", run)
    return calls


def test_a_class_that_will_not_go_is_said_not_swallowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    classid = f"1:{linkshaper.slot(ADDRESS):x}"
    scripted_tc(
        monkeypatch,
        {
            "class del": (2, "", "RTNETLINK answers: Device or resource busy"),
            "class show": (0, f"class htb {classid} root prio 0 rate 256Kbit\n", ""),
        },
    )
    with caplog.at_level(logging.WARNING, logger="rollout.lab.linkshaper"):
        linkshaper.restore(ADDRESS)
    said = f"{ADDRESS}: link not restored: RTNETLINK answers: Device or resource busy"
    assert said in caplog.text


def test_restoring_the_last_node_removes_the_qdisc(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted_tc(
        monkeypatch,
        {"qdisc show": (0, f"qdisc htb {linkshaper.ROOT} root refcnt 2\n", "")},
    )
    linkshaper.restore(ADDRESS)
    assert calls[-1][:3] == ("qdisc", "del", "dev")
