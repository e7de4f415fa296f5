"""
    TullaxBridgeCUDAExt

CUDA support for TullaxBridge, loaded by Julia when CUDA.jl is loaded next to the bridge.
It adds the CUDA methods of `backend_for("cuda")`, `wrap_cuda`, `sync_stream` and
`run_launcher_cuda!`.
"""
module TullaxBridgeCUDAExt

using TullaxBridge
using TullaxBridge: as_kernel_argument, record_launch!
using CUDA
using DLPack
using PythonCall: Py

# CUDA.jl 6 moved the driver API into CUDACore (re-exported only for public names);
# on CUDA.jl 5 it lives in CUDA itself.
const Driver = isdefined(CUDA, :CUDACore) ? CUDA.CUDACore : CUDA

TullaxBridge.cuda_backend() = CUDA.CUDABackend()

"""
    wrap_cuda(obj::Py) -> CuArray

Zero-copy `CuArray` over the device buffer behind `obj.__dlpack__()` (DLPack.jl calls it
without arguments; jax's exports are contiguous row-major, so the result has reversed
dimensions, matching the printer's reversed indices). The caller keeps `obj` alive.
"""
TullaxBridge.wrap_cuda(obj::Py) = DLPack.from_dlpack(obj)

"""
    sync_stream(ptr::Integer)

`cuStreamSynchronize` on the foreign stream `ptr` (XLA's `ctx.stream`). CUDA.jl has no
public constructor that adopts a foreign `CUstream`, so the driver call is used directly.
"""
function TullaxBridge.sync_stream(ptr::Integer)
    Driver.cuStreamSynchronize(Driver.CUstream(UInt(ptr)))
    return nothing
end

"""
    run_launcher_cuda!(mod, launcher, args...) -> Float64

Copy every host array argument (`PyArray`s are first viewed zero-copy through
`wrap_cpu`) to a `CuArray`, call `mod.launcher(CUDABackend(), device_args...)` (the printed
launcher synchronizes), then copy the output, the first argument, back into the host
array. Scalars and sizes pass through.
"""
function TullaxBridge.run_launcher_cuda!(mod::Module, launcher::Union{Symbol,AbstractString}, args...)
    name = Symbol(launcher)
    fn = getfield(mod, name)
    elapsed = GC.@preserve args begin
        host = map(as_kernel_argument, args)
        device = map(to_device, host)
        seconds = @elapsed Base.invokelatest(fn, CUDA.CUDABackend(), device...)
        copyto!(first(host), first(device))
        seconds
    end
    record_launch!(mod, name, elapsed)
    return elapsed
end

to_device(x::Array) = CuArray(x)
to_device(x) = x

end # module TullaxBridgeCUDAExt
