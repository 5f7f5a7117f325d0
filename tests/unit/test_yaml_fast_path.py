"""libyaml's parser (the fast path of SourceDocument) reads every document as PyYAML does.

Where the fast path reads a document, its data and every mark equal PyYAML's; where PyYAML
refuses a document, the fast path refuses it too (and SourceDocument then words the refusal
through PyYAML, so messages do not change).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.errors import BadInput
from rollout.inputs.yamlsource import (
    _BLOCK_LINES,
    SourceDocument,
    _FastLoader,
    _Loader,
    _PlainReader,
)
from tests.examples import REPO

CORPUS_FILES = sorted(
    p
    for root in ("examples", "tests")
    for p in (REPO / root).rglob("*")
    if p.suffix in (".yaml", ".yml") and p.is_file()
)

DOCUMENTS = (
    "a: 1\nb: [1, 2, {c: d}]\n",
    "time: 22:00\nhex: 0x1f\noct: 017\nfloat: 1.5e+3\ninf: .inf\nbool: yes\nnull: ~\n",
    "base: &b {x: 1, y: [2, 3]}\nuse: *b\nmerged:\n  <<: *b\n  z: 4\n",
    "text: |\n  line one\n  line two\n\nfolded: >-\n  a\n  b\n",
    "quoted: \"tab\\there \\u00e9\"\nsingle: 'it''s'\n\"key with: colon\": v\n",
    "ünïcode: 值\nemoji: 🚀\nafter: [x, y]\n",
    "dup: 1\ndup: 2\n",
    "a: b: c\n",
    "key: [unclosed\n",
    "- a\n- b\n -c\n",
    "a:\n\t- tab indent\n",
    "%YAML 1.1\n---\na: 1\n",
    "--- !!str 1\n",
    "a: !!binary aGVsbG8=\nb: !!python/object:os.system x\n",
    "? complex key\n: value\n",
    "a: 1\n---\nb: 2\n",
    "a: *undefined\n",
    "&x [*x]\n",
    "",
    "# only a comment\n",
    "a: 'unterminated\n",
    "list:\n- 1\n-   2\n- - nested\n  - deeper\n",
    'a: 1 # comment\nb: "x" # another\n',
    "{a: 1, b: 2, }\n",
    "a: @reserved\n",
    "a: `reserved\n",
)


def read_with(loader: type[_Loader], text: str, path: str) -> object:
    try:
        doc = SourceDocument._compose(loader(text, path, 100_000), path, 100_000)
    except (BadInput, RecursionError):
        return "refused"
    return doc.data, dict(doc.marks)


@pytest.mark.parametrize(
    "text",
    [*DOCUMENTS, *(p.read_text(encoding="utf-8", errors="replace") for p in CORPUS_FILES)],
)
def test_libyaml_reads_a_document_as_pyyaml_does(text: str) -> None:
    slow = read_with(_Loader, text, "doc.yaml")
    fast = read_with(_FastLoader, text, "doc.yaml")
    assert fast == slow or fast == "refused"


def test_a_refusal_reads_as_pyyaml_words_it(tmp_path: Path) -> None:
    text = "key: [unclosed\n"
    with pytest.raises(BadInput) as fast:
        SourceDocument.from_text(text, "doc.yaml")
    with pytest.raises(BadInput) as slow:
        SourceDocument._compose(_Loader(text, "doc.yaml", 100_000), "doc.yaml", 100_000)
    assert str(fast.value) == str(slow.value)


@pytest.mark.parametrize(
    "text",
    [
        *DOCUMENTS,
        "a: {b: [1, {c: 2}]}\nempty: {}\nnone: []\n'quoted key': x\n",
        "=: 1\n",
        "a: !!str 1\nb: !!int '2'\n",
        "!!map {a: 1}\n",
        "a: &x 1\nb: 2\n",
        "1: a\n",
        "just a scalar\n",
        *(p.read_text(encoding="utf-8", errors="replace") for p in CORPUS_FILES),
    ],
)
def test_a_plain_document_built_from_events_reads_as_pyyaml_reads_it(text: str) -> None:
    """_PlainReader's data and marks are PyYAML's, or it leaves the document to the composer."""
    slow = read_with(_Loader, text, "doc.yaml")
    plain = _PlainReader(_FastLoader(text, "doc.yaml", 100_000)).read()
    if plain is not None:
        assert (plain.data, dict(plain.marks)) == slow
        assert plain.path == "doc.yaml"


def test_recorded_node_facts_read_as_plain_documents() -> None:
    for path in sorted((REPO / "examples" / "facts").glob("*/node.yaml")):
        text = path.read_text(encoding="utf-8")
        assert _PlainReader(_FastLoader(text, str(path), 100_000)).read() is not None


def test_only_first_characters_pick_an_implicit_tag() -> None:
    """_PlainReader takes a plain scalar whose first character no resolver is keyed on for a
    string: true while there are no wildcard or path resolvers."""
    assert None not in _Loader.yaml_implicit_resolvers
    assert not _Loader.yaml_path_resolvers


def test_marks_are_read_when_first_asked_for() -> None:
    text = "a: 1\nb:\n  - x\n  - {c: 'd'}\n"
    doc = SourceDocument.from_text(text, "doc.yaml")
    eager = _PlainReader(_FastLoader(text, "doc.yaml", 100_000), with_marks=True).read()
    assert eager is not None
    slow = read_with(_Loader, text, "doc.yaml")
    assert isinstance(slow, tuple)
    assert dict(doc.marks) == dict(eager.marks) == slow[1]
    assert str(doc.location_of(("b", 1, "c"))) == "doc.yaml:4:9"


# Scalars and keys where YAML's reading is easy to get wrong: resolved types, indicators,
# quoting, comments, colons, spaces, characters outside what the line reader takes.
TRICKY_SCALARS = (
    "plain", "two words", "two  spaces", "true", "True", "yes", "No", "on", "OFF", "y", "n",
    "null", "Null", "~", "1", "-1", "+1", "0x1f", "0o17", "017", "0b101", "1_000", "1.5",
    "1e3", "1.5e+3", "+.5", ".inf", "-.Inf", ".nan", "22:00", "1:2:3", "2001-12-14",
    "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5", "a:b", "a:", "a :b", "a#b",
    "a #b", "a # comment", "'quoted'", "'it''s'", "' spaced '", "''", '"double"', '"es\\"c"',
    '""', "{}", "[]", "{a: 1}", "[1, 2]", "-a", "- a", "-", "=", "<<", "a,b", "(x)",
    "/etc/containerd/config.toml", "1.6.20~ds1-1+deb12u3", "é", "x\ty", "x ", "'open",
    "*alias", "&anchor x", "!!str 1", "!x y", "|", ">-", "%x", "@x", "`x", "?x", "? x",
    "1" * 5000, "a\rb", "a\x85b", "...", "---",
)  # fmt: skip
TRICKY_KEYS = (
    "a", "b", "name", "n", "y", "on", "1", "1.5", "true", "null", "~", "<<", "=",
    "nvidia.com/gpu.count", "k-1", "_x", "/p", "'q'", '"d"', "a b", "a:b", "-k", "2001-12-14",
)  # fmt: skip


@st.composite
def block_documents(draw: st.DrawFn) -> str:
    """Block mappings and lists of tricky scalars, now and then a line out of place."""
    lines: list[str] = []

    def mapping(indent: int, depth: int) -> None:
        for _ in range(draw(st.integers(1, 4))):
            key = draw(st.sampled_from(TRICKY_KEYS))
            shape = draw(st.sampled_from(("scalar", "scalar", "empty", "map", "list", "flat")))
            pad = " " * indent
            if shape == "scalar" or depth >= 3:
                lines.append(f"{pad}{key}: {draw(st.sampled_from(TRICKY_SCALARS))}")
            elif shape == "empty":
                lines.append(f"{pad}{key}:")
            elif shape == "map":
                lines.append(f"{pad}{key}:")
                mapping(indent + draw(st.integers(1, 4)), depth + 1)
            else:  # a list, indented or at its key's indent
                lines.append(f"{pad}{key}:")
                below = pad + " " * (draw(st.integers(1, 3)) if shape == "list" else 0)
                for _ in range(draw(st.integers(1, 3))):
                    lines.append(f"{below}- {draw(st.sampled_from(TRICKY_SCALARS))}")

    mapping(0, 0)
    for _ in range(draw(st.integers(0, 3))):  # comments, blank lines, a line out of place
        at = draw(st.integers(0, len(lines)))
        extra = draw(st.sampled_from(("# note", "  # indented note", "", "   ", "\t", "x")))
        if extra == "x" and at < len(lines):
            lines[at] = " " * draw(st.integers(0, 4)) + lines[at].lstrip(" ")
        else:
            lines.insert(at, extra)
    ending = draw(st.sampled_from(("\n", "", "\n\n", " \n")))
    return "\n".join(lines) + ending


@settings(max_examples=500, deadline=None)
@given(text=block_documents())
def test_a_document_read_line_by_line_reads_as_pyyaml_reads_it(text: str) -> None:
    """The line reader's data is PyYAML's (types included), or it leaves the document to
    libyaml and PyYAML; its marks, read when asked for, are PyYAML's too."""
    lines = _BLOCK_LINES.read(text, 100_000)
    if lines is None:
        return
    slow = read_with(_Loader, text, "doc.yaml")
    assert isinstance(slow, tuple), "the line reader read a document PyYAML refuses"
    assert lines == slow[0]
    assert repr(lines) == repr(slow[0])  # True is not 1, 1.0 is not 1
    assert dict(SourceDocument.from_text(text, "doc.yaml").marks) == slow[1]


@pytest.mark.parametrize(
    "text",
    [*DOCUMENTS, *(p.read_text(encoding="utf-8") for p in CORPUS_FILES if p.name == "node.yaml")],
)
def test_recorded_documents_read_line_by_line_as_pyyaml_reads_them(text: str) -> None:
    lines = _BLOCK_LINES.read(text, 100_000)
    slow = read_with(_Loader, text, "doc.yaml")
    if lines is not None:
        assert isinstance(slow, tuple)
        assert repr(lines) == repr(slow[0])


def test_recorded_node_facts_read_line_by_line() -> None:
    for path in sorted((REPO / "examples" / "facts").glob("*/node.yaml")):
        assert _BLOCK_LINES.read(path.read_text(encoding="utf-8"), 100_000) is not None
