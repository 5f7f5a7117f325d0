"""libyaml's parser (the fast path of SourceDocument) reads every document as PyYAML does.

Where the fast path reads a document, its data and every mark equal PyYAML's; where PyYAML
refuses a document, the fast path refuses it too (and SourceDocument then words the refusal
through PyYAML, so messages do not change).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.errors import BadInput
from rollout.yamlsource import SourceDocument, _FastLoader, _Loader, _PlainReader
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
