"""Objects that hold something open (connections, the journal's lock) and are used as `with`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Closeable(ABC):
    """Used as `with thing:`; closed on leaving the block, however it is left."""

    @abstractmethod
    def close(self) -> None:
        """Release what this object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
