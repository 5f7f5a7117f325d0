"""Sampling a system from another thread while a test acts on it, as an operator watching
with kubectl would, for assertions about everything seen along the way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def sampling(sample: Callable[[], Iterable[T]], interval_s: float) -> Iterator[list[T]]:
    """What `sample` returns every `interval_s` while the block runs, gathered into the list
    yielded (complete once the block is left)."""
    seen: list[T] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            seen.extend(sample())
            time.sleep(interval_s)

    sampler = threading.Thread(target=run, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join(timeout=10)
