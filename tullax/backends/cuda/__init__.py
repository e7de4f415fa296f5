"""The CUDA backend: CUDA C printed from the loop IR, compiled by NVRTC, launched on XLA's stream."""
