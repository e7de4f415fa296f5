"""
    TullaxBridge

The hand-written Julia half of tullax's Julia backend. Python (through juliacall) hands it
the source text of a printed kernel module; the bridge

  * evaluates that source into a fresh module ([`load_kernels`](@ref)),
  * presents NumPy/XLA host buffers as Julia arrays without copying ([`wrap_cpu`](@ref)),
  * calls a printed launcher on them ([`run_launcher_cpu!`](@ref), [`run_launcher_cuda!`](@ref)),
    or launches one kernel with its ndrange and workgroup size and synchronizes
    ([`launch!`](@ref), [`launch_cpu!`](@ref)),
  * records parse, eval and first-run times ([`timings`](@ref)),
  * writes cached kernels into a small precompilable package so that a new process loads
    them from Julia's package images ([`write_precompile_package`](@ref),
    [`load_precompiled`](@ref)).

Layout convention: a row-major NumPy array of shape `(a, b)` is the column-major Julia
array of size `(b, a)`. The kernel printer reverses index order, so no
`PermutedDimsArray` is ever needed.

What Python passes arrives through juliacall's conversion rules: NumPy arrays as `PyArray`s,
`int`/`float`/`bool`/`str` as `Int`/`Float64`/`Bool`/`String`, a `tuple` as a `Tuple` of
converted items, but a `list` or `dict` as a `PyList{Py}`/`PyDict` of `Py` objects. The entry
points therefore take tuples (or accept `PyList`s explicitly).

CUDA support lives in the package extension `TullaxBridgeCUDAExt`, which Julia loads when
`CUDA` is loaded next to this package (`tullax julia install-cuda` installs it).
"""
module TullaxBridge

using KernelAbstractions
using Atomix
using PythonCall
using PrecompileTools
using UUIDs

export load_kernels, timings, clear_timings!
export wrap_cpu
export backend_for, launch!, launch_cpu!
export run_launcher_cpu!, run_launcher_cuda!, run_launcher_cuda_device!
export write_precompile_package, precompile_package, load_precompiled

include("timings.jl")
include("loading.jl")
include("arrays.jl")
include("launch.jl")
include("precompile_package.jl")

end # module TullaxBridge
