"""The per-binding cache every device and the emulator keep their executors and plans in:
bounded per group, least recently used first out, closing what it lets go of, dropping stale
entries, one build per key under concurrent callers."""

from __future__ import annotations

import threading
import time

from kn_cuda_eval.planning.cache import BindingCache, binding_key


class Entry:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stale = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _get(cache: BindingCache[Entry], group: str, b: int) -> Entry:
    return cache.get(group, binding_key({"B": b}), lambda: Entry(f"{group}{b}"))


def test_least_recently_used_first_out_per_group_and_closed() -> None:
    cache: BindingCache[Entry] = BindingCache(2)
    one, two = _get(cache, "g", 1), _get(cache, "g", 2)
    assert _get(cache, "g", 1) is one  # used again: now the most recent
    other = _get(cache, "s", 1)  # another group has a bound of its own
    three = _get(cache, "g", 3)
    assert two.closed and not one.closed and not other.closed
    assert cache.keys("g") == [(("B", 1),), (("B", 3),)] and cache.keys("s") == [(("B", 1),)]
    assert len(cache) == 3 and cache.built == 4
    cache.clear()
    assert one.closed and three.closed and other.closed and len(cache) == 0


def test_stale_entries_are_rebuilt_and_dropped_when_anything_is_built() -> None:
    cache: BindingCache[Entry] = BindingCache(8)
    one, two = _get(cache, "g", 1), _get(cache, "g", 2)
    assert cache.has("g", (("B", 1),)) and not cache.has("g", (("B", 5),))
    one.stale = two.stale = True
    assert not cache.has("g", (("B", 1),))  # `get` would build it again
    again = _get(cache, "g", 1)
    assert again is not one and one.closed
    assert two.closed and cache.keys("g") == [(("B", 1),)]  # went with the new build


def test_concurrent_callers_build_a_key_once() -> None:
    cache: BindingCache[Entry] = BindingCache(4)
    made = []

    def make() -> Entry:
        time.sleep(0.01)
        made.append(1)
        return Entry("x")

    got: list[Entry] = []
    threads = [
        threading.Thread(target=lambda: got.append(cache.get("g", (), make))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(e is got[0] for e in got)
