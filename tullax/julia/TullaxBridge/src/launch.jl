# Choosing a backend and launching printed kernels.

"""
    backend_for(name::AbstractString) -> KernelAbstractions.Backend

`"cpu"` gives `CPU()` (KernelAbstractions runs the work-groups on Julia's threads, so set
juliacall's thread count before Julia starts); `"cuda"` gives `CUDABackend()` once CUDA.jl
is loaded (see `TullaxBridgeCUDAExt`).
"""
function backend_for(name::AbstractString)
    name == "cpu" && return CPU()
    name == "cuda" && return cuda_backend()
    throw(ArgumentError("unknown TullaxBridge backend \"$(name)\"; expected \"cpu\" or \"cuda\""))
end

# The CUDA extension adds the zero-argument method; this Vararg fallback is less specific.
cuda_backend(args...) = throw(cuda_unavailable_error("backend_for(\"cuda\")"))

"""
    launch!(mod, fname, backend, out, args...; ndrange, workgroupsize = nothing) -> Float64

Launch kernel `fname` of the kernel module `mod` (from [`load_kernels`](@ref) or
[`load_precompiled`](@ref)) on `backend` over `ndrange` and wait for it to finish. `out`
and `args` are passed to the kernel in that order; arrays must already be Julia arrays
(see [`wrap_cpu`](@ref), or use [`launch_cpu!`](@ref)).

With `workgroupsize === nothing` the kernel is instantiated as `kernel(backend)` and
KernelAbstractions picks the work-group size; otherwise `kernel(backend, workgroupsize)`.
The kernel is looked up, constructed and called through `Base.invokelatest`
([`latest_binding`](@ref)), because it was defined by `eval` after this function was
compiled, possibly in the same top-level call.

Returns the elapsed seconds of launch plus synchronize. The first launch of each kernel
(which includes JIT compilation) is recorded as its first-run time; see
[`timings`](@ref).
"""
function launch!(mod::Module, fname::Union{Symbol,AbstractString}, backend, out, args...;
                 ndrange, workgroupsize = nothing)
    name = Symbol(fname)
    kernel = instantiate(latest_binding(mod, name), backend, workgroupsize)
    dims = as_dims(ndrange)
    elapsed = @elapsed begin
        Base.invokelatest(kernel, out, args...; ndrange = dims)
        KernelAbstractions.synchronize(backend)
    end
    record_launch!(mod, name, elapsed)
    return elapsed
end

"""
    launch_cpu!(mod, fname, out, args...; ndrange, workgroupsize = nothing) -> Float64

[`launch!`](@ref) on `CPU()` for arguments as juliacall delivers them from Python: every
`PyArray` (a NumPy array or CPU `jax.Array`) becomes a zero-copy view through
[`wrap_cpu`](@ref), other arguments (integers, floats) pass through unchanged. The Python
objects stay referenced by this call until the kernel has finished.
"""
function launch_cpu!(mod::Module, fname::Union{Symbol,AbstractString}, out, args...;
                     ndrange, workgroupsize = nothing)
    py_args = (out, args...)
    elapsed = GC.@preserve py_args begin
        julia_args = map(as_kernel_argument, py_args)
        launch!(mod, fname, CPU(), julia_args...; ndrange = ndrange,
                workgroupsize = as_workgroupsize(workgroupsize))
    end
    return elapsed
end

as_kernel_argument(x::PyArray) = wrap_cpu(x)
as_kernel_argument(x) = x

"""
    run_launcher_cpu!(mod, launcher, args...) -> Float64

Call the printed host launcher `launcher` of the kernel module `mod` on `CPU()`:
`mod.launcher(CPU(), args...)`. tullax's printer emits one launcher per kernel,
`run_<kernel>!(backend, arrays..., scalars..., sizes...)`, which launches the kernel over
its ndrange and synchronizes. As in [`launch_cpu!`](@ref), every `PyArray` becomes a
zero-copy view ([`wrap_cpu`](@ref)) and stays referenced until the launcher returns; other
arguments (Float64/Int/Bool scalars and sizes) pass through unchanged.

Returns the elapsed seconds, recorded under the launcher's name (see [`timings`](@ref)).
"""
function run_launcher_cpu!(mod::Module, launcher::Union{Symbol,AbstractString}, args...)
    name = Symbol(launcher)
    fn = latest_binding(mod, name)
    elapsed = GC.@preserve args begin
        julia_args = map(as_kernel_argument, args)
        @elapsed Base.invokelatest(fn, CPU(), julia_args...)
    end
    record_launch!(mod, name, elapsed)
    return elapsed
end

"""
    run_launcher_cuda!(mod, launcher, args...) -> Float64

[`run_launcher_cpu!`](@ref) on `CUDABackend()`: host arrays (`PyArray`s) are copied to the
device, the launcher runs there, and the output, which is always the launcher's first
array argument, is copied back into the host array. Implemented by `TullaxBridgeCUDAExt`.
"""
run_launcher_cuda!(mod, launcher, args...) = throw(cuda_unavailable_error("run_launcher_cuda!"))

"""
    run_launcher_cuda_device!(mod, launcher, xla_stream, device, given, arrays, scalars, sizes) -> Nothing

Call the printed GPU launcher `launcher` of `mod` on device memory XLA owns, without a copy
and without waiting for the GPU: the `julia-cuda` backend inside `jax.jit` on an NVIDIA GPU.
`xla_stream` is XLA's `CUstream` (an integer), `device` the CUDA device ordinal of the
buffers. Each array is `(address, eltype name, Julia dims)`, wrapped as a `CuArray` that does
not own its memory (dims already reversed, as on the CPU); `given` is `()` or the array the
output starts from (`+=`, `=`), copied into the output first unless it is the same memory;
each scalar is `(address, eltype name, kernel type name)`, a one-element device array read
once; `sizes` are integers.

The work is ordered after everything XLA enqueued on `xla_stream` so far, and XLA's later
work after it, by two events recorded and waited on the streams (no host synchronisation);
the kernel itself runs on CUDA.jl's task-local stream. Implemented by `TullaxBridgeCUDAExt`.
"""
run_launcher_cuda_device!(mod, launcher, args...) =
    throw(cuda_unavailable_error("run_launcher_cuda_device!"))

"""
    instantiate(constructor, backend, workgroupsize)

The kernel object for `backend`: `constructor(backend)` lets KernelAbstractions choose the
work-group size, `constructor(backend, workgroupsize)` fixes it.
"""
instantiate(constructor, backend, ::Nothing) = Base.invokelatest(constructor, backend)
instantiate(constructor, backend, workgroupsize) =
    Base.invokelatest(constructor, backend, as_workgroupsize(workgroupsize))

"""
    latest_binding(mod, name)

The binding `name` of `mod` as the newest world sees it. Kernel modules are evaluated at
run time, often within the same top-level call that then reads them, and reading a
binding in a world older than its definition warns on Julia 1.12 (and will fail later).
"""
latest_binding(mod::Module, name::Symbol) = Base.invokelatest(getglobal, mod, name)

"""
    as_dims(x) -> NTuple{N,Int}

An ndrange as KernelAbstractions wants it: an integer (a 1-D range), a tuple, a Julia vector,
or a Python list, which arrives as a `PyList{Py}` whose items are `Py` objects (`Int(::Py)`
does not exist: they are converted with `pyconvert`).
"""
as_dims(x::Integer) = (Int(x),)
as_dims(x::Tuple) = map(Int, x)
as_dims(x::AbstractVector{<:Integer}) = Tuple(Int.(x))
as_dims(x::PyList) = Tuple(pyconvert(Vector{Int}, x))

as_workgroupsize(::Nothing) = nothing
as_workgroupsize(x) = as_dims(x)
