"""Runnable examples on top of kn_graph and kn_runtime (Stable Diffusion: `kn-sd`)."""
