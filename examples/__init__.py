"""Scripts run from a checkout (not installed): `stable_diffusion.py` (the same as `kn-sd`, whose
code lives in `kn_runtime.sd`) and `make_tiny_sd.py` (rebuilds the shipped tiny pipeline)."""
