"""The CUDA backend: generated kernels and their NVRTC compilation (`kernels`), the executor over
CuPy, cuBLAS and cuDNN (`device`, `cudnn`), and the host kernel checker that runs every generated
`.cu` kernel on the CPU (`hostcheck`). Nothing here loads a CUDA library at import time."""
