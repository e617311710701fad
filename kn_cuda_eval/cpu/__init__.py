"""kn_cuda_eval.cpu — the CPU backend: a plan's steps executed on the host over one NumPy arena
(`executor`; its arena and shared memory in `arena`, the constants' placement in `constants`, the
compiled library in `library` and its step loop in `steploop`, process-wide thread and OpenMP
setup in `runtime`), after its own plan passes (`passes`), fused steps as C printed by the shared
code generator (`csource`) and compiled once (`build`), convolutions and GEMMs through oneDNN
(`onednn`). Nothing is imported here, so each part loads only when it is used."""
