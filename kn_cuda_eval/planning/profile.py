"""`Profile`: per-step device times of one evaluation (CUDA events around every call) as a table,
with totals per kind — what `executor.profile(inputs)` returns and `kn-run --profile` prints.

>>> p = Profile("cuda:0 (test)", (ProfileRow(0, "conv", "cudnn...", 0.75),
...                                ProfileRow(1, "elementwise", "kn_ew_1", 0.25)))
>>> print(p)
profile on cuda:0 (test): 2 calls, 1.000 ms of device time
 step  kind         call        time ms       %
    0  conv         cudnn...      0.750    75.0
    1  elementwise  kn_ew_1       0.250    25.0
by kind:
  kind         calls   time ms       %
  conv             1     0.750    75.0
  elementwise      1     0.250    25.0
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KindTotal", "Profile", "ProfileRow"]


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One device call: the plan step it belongs to (-1: the executor's output copies), its kind,
    the kernel or library call, and its device time in milliseconds."""

    step: int
    kind: str
    call: str
    ms: float


@dataclass(frozen=True, slots=True)
class KindTotal:
    kind: str
    calls: int
    ms: float
    percent: float


@dataclass(frozen=True, slots=True)
class Profile:
    device: str
    rows: tuple[ProfileRow, ...]

    @property
    def total_ms(self) -> float:
        return sum(r.ms for r in self.rows)

    def percent(self, ms: float) -> float:
        total = self.total_ms
        return 100.0 * ms / total if total > 0 else 0.0

    def by_kind(self) -> list[KindTotal]:
        """Totals per kind, the most expensive first."""
        acc: dict[str, list[float]] = {}
        for r in self.rows:
            a = acc.setdefault(r.kind, [0, 0.0])
            a[0] += 1
            a[1] += r.ms
        out = [KindTotal(k, int(n), ms, self.percent(ms)) for k, (n, ms) in acc.items()]
        return sorted(out, key=lambda t: -t.ms)

    def table(self, top: int | None = None) -> str:
        """The table; with `top`, only the `top` most expensive calls (in step order)."""
        rows = list(self.rows)
        if top is not None and top < len(rows):
            keep = set(sorted(range(len(rows)), key=lambda i: -rows[i].ms)[:top])
            rows = [r for i, r in enumerate(rows) if i in keep]
        width = max([len("call"), *(len(r.call) for r in rows)])
        kind_w = max([len("elementwise"), *(len(r.kind) for r in self.rows)])
        lines = [
            f"profile on {self.device}: {len(self.rows)} calls, {self.total_ms:.3f} ms of device time"
            + (f" (the {len(rows)} most expensive shown)" if len(rows) < len(self.rows) else ""),
            f" step  {'kind':<{kind_w}}  {'call':<{width}}  {'time ms':>9}  {'%':>6}",
        ]
        for r in rows:
            step = "out" if r.step < 0 else str(r.step)
            lines.append(
                f" {step:>4}  {r.kind:<{kind_w}}  {r.call:<{width}}  {r.ms:>9.3f}  "
                f"{self.percent(r.ms):>6.1f}"
            )
        lines.append("by kind:")
        lines.append(f"  {'kind':<{kind_w}}  {'calls':>5}  {'time ms':>8}  {'%':>6}")
        for t in self.by_kind():
            lines.append(f"  {t.kind:<{kind_w}}  {t.calls:>5}  {t.ms:>8.3f}  {t.percent:>6.1f}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
