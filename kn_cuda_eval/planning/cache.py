"""The one cache of things built per binding of a graph's size symbols: plans, host and CUDA
executors (`kn_runtime.PreparedGraph`, per graph and per segment of a graph run in segments),
the prepared graphs of a value-specialized model, the emulator's plans (`segments.emulate_graph`).

It lives in `planning` because both the planner's segmented emulator and `kn_runtime` use it,
and planning may import no backend while kn_runtime may import planning: here neither layer
reaches up.

>>> class Ex:
...     stale = False
...     def __init__(self, n): self.n = n
...     def close(self): print("closed", self.n)
>>> cache = BindingCache(2)
>>> for b in (1, 2, 1, 3):
...     _ = cache.get("g", binding_key({"B": b}), lambda b=b: Ex(b))
closed 2
>>> cache.keys("g")
[(('B', 1),), (('B', 3),)]
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, Protocol, TypeVar

__all__ = ["Binding", "BindingCache", "Cached", "binding_key"]

Binding = tuple[tuple[str, int], ...]
"""Symbol values as a cache key: (name, value) pairs sorted by name."""


def binding_key(bindings: Mapping[str, int]) -> Binding:
    return tuple(sorted(bindings.items()))


class Cached(Protocol):
    """What the cache keeps: something it can close when it lets go of it, and that may go
    `stale` (the CPU executor's arena was replaced by a larger binding's): then it is built
    again."""

    @property
    def stale(self) -> bool: ...

    def close(self) -> None: ...


E = TypeVar("E", bound=Cached)


class BindingCache(Generic[E]):
    """At most `max_bindings` entries per group (a graph, a segment of one), least recently used
    first out; what leaves is closed. A stale entry is built again when asked for, and every
    stale entry is dropped whenever a new one is built (a new CPU executor may have replaced the
    arena the others ran in). Thread-safe: an entry is built under the cache's lock, so
    concurrent callers asking for the same key build it once."""

    def __init__(self, max_bindings: int) -> None:
        self.max_bindings = max(1, int(max_bindings))
        self._entries: collections.OrderedDict[tuple[Hashable, Hashable], E] = (
            collections.OrderedDict()
        )
        self.built = 0
        """Entries made, those built again after going stale or being evicted included."""
        self.dropped = 0
        """Entries let go of (stale, evicted, cleared): a caller that remembers an entry outside
        the cache (`PreparedGraph`'s last executor) trusts it while this has not moved."""
        self._lock = threading.RLock()

    def get(self, group: Hashable, key: Hashable, make: Callable[[], E]) -> E:
        """The entry of `key` in `group`, made by `make()` when missing or stale."""
        with self._lock:
            k = (group, key)
            entry = self._entries.get(k)
            if entry is not None and entry.stale:
                self._drop(k)
                entry = None
            if entry is not None:
                self._entries.move_to_end(k)
                return entry
            entry = make()
            self.built += 1
            for old in [o for o, e in self._entries.items() if e.stale]:
                self._drop(old)
            self._entries[k] = entry
            in_group = [o for o in self._entries if o[0] == group]
            for old in in_group[: max(0, len(in_group) - self.max_bindings)]:
                self._drop(old)
            return entry

    def _drop(self, k: tuple[Hashable, Hashable]) -> None:
        self.dropped += 1
        self._entries.pop(k).close()

    def has(self, group: Hashable, key: Hashable) -> bool:
        """Whether `get(group, key, ...)` would return a kept entry without making one."""
        with self._lock:
            entry = self._entries.get((group, key))
            return entry is not None and not entry.stale

    def keys(self, group: Hashable) -> list[Hashable]:
        """The keys kept in `group`, least recently used first."""
        with self._lock:
            return [k for g, k in self._entries if g == group]

    def values(self) -> list[E]:
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Close and drop every entry."""
        with self._lock:
            while self._entries:
                self.dropped += 1
                self._entries.popitem(last=False)[1].close()
