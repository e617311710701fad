"""Memory of the CPU backend under changing shapes: one arena per prepared graph that grows to
the largest binding, weights packed once for every binding, a bounded cache of executors, and
memory that really leaves (private mappings: Rss, not pages moved to shared memory)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kn_cuda_eval.cpu import onednn
from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import assert_close, mapping_fields

D = 64


def _dynamic_model() -> tuple[Graph, list[np.ndarray]]:
    """[1, C, H, W] image through two convolutions, and [S, D] tokens through a GEMM with
    constant weights: H, W and S are symbols, so every new size is a new binding."""
    rng = np.random.default_rng(5)
    g = Graph()
    h, w, s = Size.sym("h"), Size.sym("w"), Size.sym("s")
    x = g.input(Shape.of(1, 16, h, w), DType.F32, "x")
    t = g.input(Shape.of(s, D), DType.F32, "t")
    w1 = g.constant((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32))
    w2 = g.constant((rng.standard_normal((16, 32, 3, 3)) * 0.1).astype(np.float32))
    wt = g.constant((rng.standard_normal((D, 96)) * 0.1).astype(np.float32))
    g.add_output(g.conv(g.relu(g.conv(x, w1, padding=(1, 1))), w2, padding=(1, 1)), "y")
    g.add_output(g.matmul_nd(t, wt), "u")
    return g, [w1, w2, wt]


def _feed(hw: int, s: int) -> list[np.ndarray]:
    rng = np.random.default_rng(hw * 100 + s)
    return [
        rng.standard_normal((1, 16, hw, hw)).astype(np.float32),
        rng.standard_normal((s, D)).astype(np.float32),
    ]


def _check(p: object, g: Graph, feed: list[np.ndarray], what: str) -> None:
    got = p.eval(feed)  # type: ignore[attr-defined]
    for a, b in zip(got, evaluate(g, feed), strict=True):
        assert_close(a, b, what)


def test_bindings_share_one_arena_and_the_weights_packed_once() -> None:
    g, _ = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g)
    sizes = [(8, 5), (12, 9), (6, 3), (12, 17), (10, 2)]
    seen = []
    for hw, s in sizes:
        _check(p, g, _feed(hw, s), f"h=w={hw}, s={s}")
        seen.append(p.memory())
    # a size that outgrows the arena's headroom replaces it, and the executors built over the
    # old one go with it; each size was built once
    counts = [m["executors"] for m in seen]
    assert all(b <= a + 1 for a, b in itertools.pairwise(counts)), counts
    assert p.cache.built == len(sizes)
    if onednn.available() is None:
        # every binding after the first found its weights packed (a layout a new size picks
        # may add one; none here grows the store past the first binding's twice)
        assert seen[0]["packed"] > 0
        assert all(m["packed"] <= 2 * seen[0]["packed"] for m in seen), seen
        assert seen[-1]["packed"] == seen[3]["packed"]  # nothing new for a size seen before
    # one arena, grown to the largest binding (with headroom), not one per binding
    executors = p.cache.values()
    largest = max(ex.arena.size for ex in executors)  # type: ignore[attr-defined]
    assert seen[-1]["arena"] <= largest * 5 // 4 + 2 * 4096
    bases = {ex.arena.ctypes.data for ex in executors}  # type: ignore[attr-defined]
    assert len(bases) == 1, "every executor runs in the same arena"
    assert not any(ex.stale for ex in executors)


def test_the_executor_cache_is_bounded_and_rebuilds_what_it_evicted() -> None:
    g, _ = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g, max_bindings=2)
    for hw, s in [(8, 5), (9, 6), (10, 7), (8, 5)]:  # the last one was evicted
        _check(p, g, _feed(hw, s), f"h=w={hw}, s={s}")
        assert p.memory()["executors"] <= 2
    assert p.cache.built >= 4
    keys = p.cache.keys(p.graph.id)
    assert keys[-1] == (("h", 8), ("s", 5), ("w", 8))  # most recently used last


def test_a_larger_binding_replaces_the_arena_and_older_executors_are_rebuilt() -> None:
    g, _ = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g)
    small = _feed(6, 3)
    _check(p, g, small, "small")
    (ex_small,) = p.cache.values()
    _check(p, g, _feed(24, 40), "large")  # more than the arena's headroom
    assert ex_small.stale
    _check(p, g, small, "small again, over the new arena")
    assert not any(ex.stale for ex in p.cache.values())
    assert p.cache.built == 3


def test_a_packed_constant_that_is_also_an_output_keeps_its_bytes() -> None:
    """GEMM weights oneDNN packs give their arena pages back; a graph output that is the same
    constant must still read it (with a private arena the pages would read as zeros)."""
    rng = np.random.default_rng(9)
    g = Graph()
    x = g.input(Shape.of(3, 256), DType.F32, "x")
    w = g.constant(rng.standard_normal((256, 512)).astype(np.float32))  # 512 KB: whole pages
    g.add_output(g.matmul_nd(x, w), "y")
    g.add_output(w, "w")
    feed = [rng.standard_normal((3, 256)).astype(np.float32)]
    p = Device.cpu(threads=2).prepare(g)
    for _ in range(2):
        _check(p, g, feed, "packed constant as an output")


def _vm_flags(address: int) -> list[str]:
    return mapping_fields(address)["VmFlags"].split()


def test_the_arena_is_a_private_mapping() -> None:
    """Pages given back from a shared mapping move to shared memory (VmRSS stops counting them,
    the machine still holds them); a private mapping frees them."""
    g, _ = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g)
    _check(p, g, _feed(8, 5), "one binding")
    (ex,) = p.cache.values()
    assert "sh" not in _vm_flags(ex.arena.ctypes.data)  # type: ignore[attr-defined]
    ws = p.backend.shared(p.graph).workspace  # type: ignore[attr-defined]
    if ws is not None and ws.mapped:
        assert "sh" not in _vm_flags(ws._block[1].ctypes.data)


def _rss_and_shmem() -> int:
    """This process's resident bytes, shared memory included (smaps_rollup Rss counts the shmem
    pages it maps; pages of shmem it no longer maps are counted by RssShmem nowhere, which is
    why the arena must not be shared)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Rss in smaps_rollup")


@pytest.mark.parametrize("max_bindings", [4])
def test_memory_stays_flat_over_many_bindings(max_bindings: int) -> None:
    """40 evaluations at 20 sizes: after the largest size has been seen, resident memory grows
    by less than one arena (executors past the cache's bound are evicted)."""
    g, _ = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g, max_bindings=max_bindings)
    rng = np.random.default_rng(0)
    sizes = [
        (int(a), int(b))
        for a, b in zip(rng.integers(4, 16, 20), rng.integers(1, 64, 20), strict=True)
    ]
    _check(p, g, _feed(16, 64), "largest first")
    base = _rss_and_shmem()
    arena = p.memory()["arena"]
    for i in range(40):
        hw, s = sizes[i % len(sizes)]
        p.eval(_feed(hw, s))
        assert p.memory()["executors"] <= max_bindings
    grown = _rss_and_shmem() - base
    assert p.memory()["arena"] == arena  # never replaced: the largest came first
    assert grown < max(arena, 1 << 20) + (4 << 20), (grown, arena)


def test_alternating_bindings_of_an_export_share_the_arena_and_stay_right() -> None:
    """A real export (BERT, dynamo) at alternating sequence lengths: its plans hold constants the
    planner made for each length after the graph's own; every executor runs in the one arena
    and puts its own constants back when another ran in between."""
    from kn_graph.onnx import load_onnx
    from tests.fuzz.runner import MODELS

    g = load_onnx(MODELS / "bert_dynamo.onnx")
    p = Device.cpu(threads=2).prepare(g)
    rng = np.random.default_rng(1)
    for s in [9, 5, 9, 17, 5, 17, 9]:
        feed = [
            rng.integers(0, 50, (1, s)).astype(np.int64),
            (rng.random((1, s)) < 0.8).astype(np.int64),
            np.zeros((1, s), np.int64),
        ]
        _check(p, g, feed, f"seq={s}")
    executors = p.cache.values()
    assert len({ex.arena.ctypes.data for ex in executors}) == 1  # type: ignore[attr-defined]
    arena = p.backend.shared(p.graph).arena  # type: ignore[attr-defined]
    assert all(ex._home is arena for ex in executors)  # type: ignore[attr-defined]


def test_a_mapped_constant_is_copied_in_chunks_that_hand_their_pages_back(
    tmp_path, monkeypatch
) -> None:
    """`copy_constant` copies a constant that views a mapped file chunk by chunk, each chunk's
    file pages handed back after it (so a large table is never resident twice): every byte
    arrives, for a size that is no multiple of the chunk, and the file's pages are gone."""
    from pathlib import Path

    from kn_cuda_eval.cpu import constants
    from kn_graph.filemap import MappedFile

    data = np.random.default_rng(4).integers(0, 255, 300_001, dtype=np.uint8)
    path = (tmp_path / "w.bin").resolve()
    path.write_bytes(data.tobytes())
    mapped = np.frombuffer(MappedFile(path).view(0, data.size), np.uint8)
    monkeypatch.setattr(constants, "COPY_CHUNK", 4096 * 7)
    arena = np.zeros(data.size + 100, np.uint8)
    assert int(mapped.sum()) == int(data.sum())  # every page of the map read in
    constants.copy_constant(arena, 64, mapped)
    assert np.array_equal(arena[64 : 64 + data.size], data) and not arena[:64].any()
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:
            inside = len(head) >= 6 and head[-1] == str(path)
        elif line.startswith("Rss:") and inside:
            rss += int(head[1])
    assert rss <= 8, rss  # kB: at most the pages at the ends


def test_packed_weights_are_packed_from_the_constant_and_never_copied_in() -> None:
    """A constant oneDNN packs is packed straight from its own bytes: its region of the arena is
    never written (all zero) while the products are right (both convolutions' weights and the
    GEMM's)."""
    g, values = _dynamic_model()
    p = Device.cpu(threads=2).prepare(g)
    _check(p, g, _feed(8, 5), "h=w=8, s=5")
    if onednn.available() is not None:
        return  # nothing packed: every constant is read in the arena
    (ex,) = p.cache.values()
    arena = ex.arena  # type: ignore[attr-defined]
    weights = [g.const_value(v) for v in values]
    regions = [
        (off, d)
        for off, d in ex.plan.constants  # type: ignore[attr-defined]
        if any(d.size == w.size and np.array_equal(d.reshape(-1), w.reshape(-1)) for w in weights)
    ]
    assert len(regions) == 3, [d.shape for _, d in ex.plan.constants]  # type: ignore[attr-defined]
    assert all(not arena[off : off + d.nbytes].any() for off, d in regions)
