"""Stable Diffusion 1.x over ONNX exports: CLIP tokenizer, schedulers, model executors and the
pipeline that `examples/stable_diffusion.py` (`kn-sd`) drives."""
