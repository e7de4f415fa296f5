"""
    TullaxBridgeCUDAExt

CUDA support for TullaxBridge, loaded by Julia when CUDA.jl is loaded next to the bridge.
It adds the CUDA methods of `backend_for("cuda")` and `run_launcher_cuda!`.

Installed by `tullax julia install-cuda` with the compat `CUDA = "5, 6"`, which resolves to
CUDA.jl 5: every Atomix 1.x declares `CUDA = "5"` for its CUDA extension.
"""
module TullaxBridgeCUDAExt

using TullaxBridge
using TullaxBridge: as_kernel_argument, latest_binding, record_launch!
using CUDA

TullaxBridge.cuda_backend() = CUDA.CUDABackend()

"""
    run_launcher_cuda!(mod, launcher, args...) -> Float64

Copy every host array argument (`PyArray`s are first viewed zero-copy through
`wrap_cpu`) to a `CuArray`, call `mod.launcher(CUDABackend(), device_args...)` (the printed
launcher synchronizes), then copy the output, the first argument, back into the host
array. Scalars and sizes pass through.
"""
function TullaxBridge.run_launcher_cuda!(mod::Module, launcher::Union{Symbol,AbstractString}, args...)
    name = Symbol(launcher)
    fn = latest_binding(mod, name)
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
