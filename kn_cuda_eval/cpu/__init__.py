"""kn_cuda_eval.cpu — the fast CPU backend: a plan's steps executed on the host over one NumPy
arena (convolutions and GEMMs through oneDNN, `kn_cuda_eval.cpu.onednn`; fused steps as
compiled C). Nothing is imported here, so each part loads only when it is used."""
