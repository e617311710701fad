"""The device-neutral plan: a graph turned into steps over one arena (`plan.plan`), with strided
views (`view`), memory assignment (`memory`), fused-step programs (`program`, `lazy`), the step
records (`steps`), the planner and its helpers (`planner`, `convplan`, `gemm`, `reduceplan`),
checks (`validate`, `limits`), the NumPy plan emulator (`emulator`) and segmented plans for
data-dependent graphs (`segments`). Nothing here imports a backend or the code generator."""
