"""Bounded, thread-safe caches: the one place rollout keeps computed values for reuse.

A fleet repeats a few node configurations many times, so the engine and the planner keep
results keyed by their inputs. Least recently used entries leave first; errors are never
kept (a computation that raises stores nothing), so a failing input always reports itself.
`DiskMemo` keeps deterministic results between runs, on disk, addressed by their inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import operator
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most `entries` values by key; callers only read what they get back."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.entries:
                self._values.popitem(last=False)

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The kept value, else `compute()` kept (computed outside the lock)."""
        hit = self.get(key)
        if hit is not None:
            return hit
        value = compute()
        self.put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._values)


class IdentityMemo(Generic[V]):
    """Values keyed by the identity of their inputs (objects that are not hashable).

    The inputs are kept with the value, so an id cannot be reused while its entry exists.
    """

    def __init__(self, entries: int) -> None:
        self._cache: BoundedCache[tuple[int, ...], tuple[tuple[object, ...], V]] = BoundedCache(
            entries
        )
        # the entry last asked for: a planner asks for one node's value many times in a row
        # (one read, one assignment: safe across threads without the lock)
        self._last: tuple[tuple[object, ...], V] | None = None

    def get_or_compute(self, inputs: tuple[object, ...], compute: Callable[[], V]) -> V:
        last = self._last
        if last is not None and _same_objects(last[0], inputs):
            return last[1]
        key = tuple(id(x) for x in inputs)
        hit = self._cache.get(key)
        if hit is not None and _same_objects(hit[0], inputs):
            self._last = hit
            return hit[1]
        value = compute()
        entry = (inputs, value)
        self._cache.put(key, entry)
        self._last = entry
        return value


def _same_objects(kept: tuple[object, ...], inputs: tuple[object, ...]) -> bool:
    return len(kept) == len(inputs) and all(map(operator.is_, kept, inputs))


class ValueTable(Generic[V]):
    """One shared value per key, made by `make(*key)`: for immutable values built again and
    again from the same parts (a fleet's nodes plan the same steps).

    A plain dict, emptied when it reaches `entries` (bounded, and cheaper than LRU order for
    values that cost a constructor call); without a lock: two threads making one key make
    equal values, and either may be kept.
    """

    def __init__(self, make: Callable[..., V], entries: int) -> None:
        self._make = make
        self._entries = entries
        self._values: dict[tuple[Hashable, ...], V] = {}

    def get(self, *key: Hashable) -> V:
        """The value made of these parts; the first one made, while it is kept."""
        value = self._values.get(key)
        if value is None:
            if len(self._values) >= self._entries:
                self._values.clear()
            value = self._values[key] = self._make(*key)
        return value


# What a DiskMemo keeps: JSON that reads back as the very value written.
Json = Any
DISK_MEMO_MAX_BYTES = 64 * 1024 * 1024
_ENTRY_SUFFIX = ".json"
_MISS = object()


class DiskMemo:
    """Deterministic results kept on disk between runs, addressed by their inputs' content.

    The key is a JSON value naming every input the result depends on (a binary by its digest,
    file contents, the code that computes it); an entry is stored under the SHA-256 of the
    key and holds the key, which a read compares, so a damaged or colliding entry is a miss,
    never a wrong answer. Entries are written to a temporary file and renamed into place:
    concurrent runs read a whole entry or none. When the entries pass `max_bytes`, the least
    recently used leave first (a hit touches its entry). Errors are never kept, and neither
    is a value JSON would not give back as it was (a tuple, a date). A directory that cannot
    be written to keeps nothing: every lookup computes.
    """

    def __init__(self, root: Path, max_bytes: int = DISK_MEMO_MAX_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._digests: dict[tuple[str, int, int, int, int, int], str] = {}

    @classmethod
    def from_setting(cls, setting: str | None, default_root: Callable[[], Path]) -> DiskMemo | None:
        """The memo an environment setting names: unset or empty, `default_root()`; `off`,
        none; anything else, that directory."""
        if setting is None or not setting.strip():
            return cls(default_root())
        if setting.strip().lower() == "off":
            return None
        return cls(Path(setting).expanduser())

    def get_or_compute(self, key: Json, compute: Callable[[], Json]) -> Json:
        """The kept value for `key`, else `compute()`, kept when it is plain JSON."""
        text = json.dumps(key, sort_keys=True, separators=(",", ":"))
        path = self.root / (hashlib.sha256(text.encode()).hexdigest() + _ENTRY_SUFFIX)
        hit = self._read(path, text)
        if hit is not _MISS:
            return hit
        value = compute()
        if _plain_json(value):
            self._write(path, text, value)
        return value

    def file_digest(self, path: str) -> str:
        """The SHA-256 of a file's bytes, kept by the file's identity (device, inode, size,
        modification and change times): writing the file or replacing it changes its change
        time or its inode, which the kernel sets and no caller can set back."""
        found = os.stat(path)
        identity = (
            os.path.realpath(path),
            found.st_dev,
            found.st_ino,
            found.st_size,
            found.st_mtime_ns,
            found.st_ctime_ns,
        )
        digest = self._digests.get(identity)
        if digest is None:
            digest = str(self.get_or_compute(["file sha256", *identity], lambda: _sha256(path)))
            self._digests[identity] = digest
        return digest

    def _read(self, path: Path, key_text: str) -> Json:
        try:
            with open(path, "rb") as stored:
                entry = json.loads(stored.read())
            if entry.get("key") != key_text or "value" not in entry:
                return _MISS
        except (OSError, ValueError, AttributeError):
            return _MISS  # absent, removed meanwhile, damaged: compute it again
        with contextlib.suppress(OSError):  # a memo others keep may be read-only
            os.utime(path)  # recently used
        return entry["value"]

    def _write(self, path: Path, key_text: str, value: Json) -> None:
        data = json.dumps({"key": key_text, "value": value}).encode()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".entry-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            self._trim()
        except OSError:
            return  # a memo that cannot keep a value still gives it

    def _trim(self) -> None:
        """Remove the least recently used entries until they fit in max_bytes."""
        entries = []
        with os.scandir(self.root) as found:
            for item in found:
                if item.name.endswith(_ENTRY_SUFFIX) and not item.name.startswith("."):
                    with contextlib.suppress(OSError):  # another run removed it meanwhile
                        stat = item.stat()
                        entries.append((stat.st_mtime_ns, stat.st_size, item.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
            total -= size


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _plain_json(value: object) -> bool:
    """Whether JSON gives `value` back as it is: dicts of str keys, lists, str, bool, int,
    finite floats and None."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    return False


def source_digest(*modules: object) -> str:
    """The SHA-256 of modules' source files: a key part that changes with the code computing
    a kept value, so a new rollout never reads what an older one computed."""
    digest = hashlib.sha256()
    for module in modules:
        source = getattr(module, "__file__", None)
        if source is None:
            raise ValueError(f"{module!r} has no source file to digest")
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()
