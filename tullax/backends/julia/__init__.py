"""The Julia backends (KernelAbstractions.jl on the CPU, CUDA.jl on NVIDIA GPUs) via juliacall."""
