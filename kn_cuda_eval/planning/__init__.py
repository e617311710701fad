"""The device-neutral plan: a graph turned into steps over one arena (`plan.plan`), with strided
views (`view`), the step records (`steps`), fused-step programs (`program`, `lazy`), the planner
(`planner`, its switches in `settings`) and its visitor modules (`attnplan`, `convplan`, `gemm`,
`reduceplan`, which see it through `context`), memory assignment (`assign`, packing in
`memory`), checks (`validate`, `limits`), the NumPy plan emulator (`emulator`) and segmented
plans for data-dependent graphs (`segments`). Nothing here imports a backend or the code
generator."""
