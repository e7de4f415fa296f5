"""
    TullaxBridgeCUDAExt

CUDA support for TullaxBridge, loaded by Julia when CUDA.jl is loaded next to the bridge.
It adds the CUDA methods of `backend_for("cuda")`, `run_launcher_cuda!` (host arrays, copied)
and `run_launcher_cuda_device!` (XLA's device buffers and stream: no copy, no host wait).

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
`wrap_cpu`) to a `CuArray`, call `mod.launcher(CUDABackend(), device_args...)`, wait for it,
then copy the output, the first argument, back into the host array. Scalars and sizes pass
through. (NumPy inputs; under `jax.jit` on a GPU tullax takes `run_launcher_cuda_device!`.)
"""
function TullaxBridge.run_launcher_cuda!(mod::Module, launcher::Union{Symbol,AbstractString}, args...)
    name = Symbol(launcher)
    fn = latest_binding(mod, name)
    elapsed = GC.@preserve args begin
        host = map(as_kernel_argument, args)
        device = map(to_device, host)
        seconds = @elapsed begin
            Base.invokelatest(fn, CUDA.CUDABackend(), device...)
            CUDA.synchronize()  # the GPU launcher returns at once
        end
        copyto!(first(host), first(device))
        seconds
    end
    record_launch!(mod, name, elapsed)
    return elapsed
end

to_device(x::Array) = CuArray(x)
to_device(x) = x

"Element types of the arrays and scalars Python describes by name (every type the printer names)."
const DEVICE_ELTYPES = Dict{String,DataType}(
    "Float16" => Float16, "Float32" => Float32, "Float64" => Float64,
    "Int8" => Int8, "Int16" => Int16, "Int32" => Int32, "Int64" => Int64,
    "UInt8" => UInt8, "UInt16" => UInt16, "UInt32" => UInt32, "UInt64" => UInt64,
    "Bool" => Bool, "ComplexF32" => ComplexF32, "ComplexF64" => ComplexF64)

device_eltype(name::AbstractString) = get(DEVICE_ELTYPES, name) do
    throw(ArgumentError("no device element type named \"$(name)\""))
end

"""
    wrap_device((address, eltype, dims)) -> CuArray

The device buffer at `address` (XLA's, row-major) as the column-major `CuArray` of size
`dims` (already reversed by Python): no copy, and the array does not own the memory.
"""
function wrap_device(array::Tuple)
    address, name, dims = array
    T = device_eltype(name)
    return unsafe_wrap(CuArray, CuPtr{T}(UInt(address)), Tuple(Int.(dims)); own = false)
end

"One device scalar, `(address, eltype, kernel type)`, read on the task-local stream."
function read_device_scalar(scalar::Tuple)
    address, name, kind = scalar
    T = device_eltype(name)
    value = Array(unsafe_wrap(CuArray, CuPtr{T}(UInt(address)), (1,); own = false))[1]
    return device_eltype(kind)(value)
end

"The two events that hand work between XLA's stream and ours, per device, reused by every call: a wait
takes the event's most recent record at the time it is enqueued, so recording again later is safe."
const HANDOFF = Dict{Int,Tuple{CuEvent,CuEvent}}()
const HANDOFF_LOCK = ReentrantLock()

handoff_events(device::Int) = lock(HANDOFF_LOCK) do
    get!(HANDOFF, device) do
        (CuEvent(CUDA.EVENT_DISABLE_TIMING), CuEvent(CUDA.EVENT_DISABLE_TIMING))
    end
end

function TullaxBridge.run_launcher_cuda_device!(mod::Module, launcher::Union{Symbol,AbstractString},
                                                xla_stream::Integer, device::Integer, given::Tuple,
                                                arrays::Tuple, scalars::Tuple, sizes::Tuple)
    CUDA.device!(Int(device))
    fn = latest_binding(mod, Symbol(launcher))
    theirs = CUDA.CUstream(UInt(xla_stream))
    ours = CUDA.stream()
    ready, done = handoff_events(Int(device))
    # ours waits for what XLA enqueued so far (the inputs are written, the output buffer is free)
    CUDA.cuEventRecord(ready, theirs)
    CUDA.cuStreamWaitEvent(ours, ready, 0)
    device_arrays = map(wrap_device, arrays)
    if !isempty(given) && first(given) != first(first(arrays))
        copyto!(first(device_arrays), wrap_device(given))  # enqueued on ours: the start of `+=` / `=`
    end
    values = map(read_device_scalar, scalars)
    Base.invokelatest(fn, CUDA.CUDABackend(), device_arrays..., values..., map(Int, sizes)...)
    # XLA's later work waits for ours; nothing here waits on the host
    CUDA.cuEventRecord(done, ours)
    CUDA.cuStreamWaitEvent(theirs, done, 0)
    return nothing
end

end # module TullaxBridgeCUDAExt
