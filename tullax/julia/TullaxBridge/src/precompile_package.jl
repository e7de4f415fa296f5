# Writing cached kernels into a small precompilable package (`tullax cache warm --backend julia`).
#
# Kernels evaluated at run time are JIT-compiled again in every process. Kernels defined in
# a package and exercised by a PrecompileTools workload while that package precompiles are
# stored in its package image, so a new process loads them compiled (CPU kernels; on CUDA
# the device code is still compiled per session).

"Namespace for the deterministic UUIDs of generated kernel packages (TullaxBridge's own UUID)."
const PACKAGE_UUID_NAMESPACE = UUID("7d17cc8a-f6ec-4256-ad47-b6c60ebc89b4")

"Element types a workload may allocate (every type tullax's printer names); they are written into Julia
source, so the list is closed."
const WORKLOAD_ELTYPES = (:Float16, :Float32, :Float64, :Int8, :Int16, :Int32, :Int64, :UInt8, :UInt16, :UInt32,
                          :UInt64, :Bool, :ComplexF32, :ComplexF64)

const IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_!]*$"
const DOTTED_PATH = r"^[A-Za-z_][A-Za-z0-9_!]*(\.[A-Za-z_][A-Za-z0-9_!]*)*$"

"""
    WorkloadArg

One kernel argument in a precompile workload: an array of element type `eltype` and
Julia (column-major, i.e. NumPy-reversed) size `dims`, filled with zeros when `eltype` is an
integer type (the printed kernels index from 0, so an index array of zeros is valid for any
non-empty axis) and with ones otherwise; or, when `dims === nothing`, the scalar
`eltype(value)`.
"""
struct WorkloadArg
    eltype::Symbol
    dims::Union{Nothing,Vector{Int}}
    value::Real
end

"""
    WorkloadCall

One kernel launch in a precompile workload: `kernel` is the dotted path of the kernel
below the package module (`"TullaxK_1a2b.fwd!"` for a kernel in a printed
`module TullaxK_1a2b`, or just `"fwd!"`), `args` its arguments in order, `ndrange` the
launch range. Sizes should be tiny: the workload runs each kernel once.

With `launcher = true`, `kernel` names a printed host launcher instead
(`"TullaxKernels_1a2b.run_kernel!"`), called as `launcher(backend, args...)`: it computes
the ndrange and synchronizes itself, exactly as tullax calls it at run time, so the
package image holds the same specializations (`ndrange` is then ignored).
"""
struct WorkloadCall
    kernel::String
    args::Vector{WorkloadArg}
    ndrange::Vector{Int}
    launcher::Bool
end

WorkloadCall(kernel::String, args::Vector{WorkloadArg}, ndrange::Vector{Int}) =
    WorkloadCall(kernel, args, ndrange, false)

"""
    WorkloadCall(t::Tuple)

Build a call from the plain data Python sends, nested tuples of strings, integers, floats
and booleans (juliacall hands a Python tuple over as a Julia `Tuple` of converted items,
while a list or a dict would arrive as a `PyList{Py}`/`PyDict` of `Py` objects):
`(kernel, launcher, ndrange, args)`, for example
`("Mod.run_k!", true, (), (("Float32", (3, 2)), ("Float64", 1.0), ("Int64", 4)))`, where an
array argument is `(eltype, dims)` and a scalar one `(eltype, value)`.
"""
function WorkloadCall((kernel, launcher, ndrange, args)::Tuple{AbstractString,Bool,Tuple{Vararg{Integer}},Tuple})
    occursin(DOTTED_PATH, kernel) || throw(ArgumentError("invalid kernel path \"$(kernel)\""))
    all(>=(0), ndrange) || throw(ArgumentError("negative ndrange $(ndrange) for $(kernel)"))
    return WorkloadCall(String(kernel), WorkloadArg[WorkloadArg(a) for a in args], collect(Int, ndrange), launcher)
end

WorkloadCall(c::WorkloadCall) = c

function WorkloadArg((type, dims)::Tuple{AbstractString,Tuple{Vararg{Integer}}})
    all(>=(0), dims) || throw(ArgumentError("negative array size $(dims)"))
    return WorkloadArg(workload_eltype(type), collect(Int, dims), 0)
end

WorkloadArg((type, value)::Tuple{AbstractString,Real}) = WorkloadArg(workload_eltype(type), nothing, value)

function workload_eltype(type::AbstractString)::Symbol
    T = Symbol(type)
    T in WORKLOAD_ELTYPES ||
        throw(ArgumentError("unsupported workload element type $(T); expected one of $(WORKLOAD_ELTYPES)"))
    return T
end

"""
    write_precompile_package(dir, name, sources, signatures) -> String

Write the package `name` into `joinpath(dir, name)` and return that path:

  * `Project.toml` with a UUID derived from `name` (the same name always gets the same
    UUID) and KernelAbstractions, Atomix and PrecompileTools as dependencies,
  * `src/kernels_<i>.jl`, one per printed kernel source in `sources` (each typically a
    `module TullaxK_... end` block, which becomes a submodule of the package),
  * `src/<name>.jl`, which includes them and runs a PrecompileTools `@compile_workload`
    launching every kernel in `signatures` once on `CPU()` with tiny arrays.

`sources` is a tuple of strings and `signatures` a tuple of [`WorkloadCall`](@ref)s or of the
tuples Python sends (see `WorkloadCall(::Tuple)`). A kernel that throws in the workload only
logs a warning: it has been compiled by then, and it compiles again at first use otherwise.

Load the result with [`load_precompiled`](@ref). Files are replaced atomically; the caller
serializes concurrent writers (tullax holds the cache lock).
"""
function write_precompile_package(dir::AbstractString, name::AbstractString, sources::Tuple{Vararg{AbstractString}},
                                  signatures::Tuple)::String
    occursin(IDENTIFIER, name) && !occursin('!', name) ||
        throw(ArgumentError("invalid package name \"$(name)\": use letters, digits and _"))
    calls = WorkloadCall[WorkloadCall(s) for s in signatures]
    pkgdir = joinpath(String(dir), String(name))
    srcdir = joinpath(pkgdir, "src")
    rm(srcdir; recursive = true, force = true)   # drop kernel files of an earlier, larger write
    mkpath(srcdir)
    files = String[]
    for (i, src) in enumerate(sources)
        file = "kernels_$(i).jl"
        write_atomically(joinpath(srcdir, file), String(src))
        push!(files, file)
    end
    write_atomically(joinpath(pkgdir, "Project.toml"), project_toml(name))
    write_atomically(joinpath(srcdir, "$(name).jl"), package_source(name, files, calls))
    return pkgdir
end

"""
    precompile_package(pkgdir) -> Float64

Precompile the package written by [`write_precompile_package`](@ref) at `pkgdir` (running
its workload in Julia's precompilation process) WITHOUT loading it into this session, so
that a package already loaded here does not stop a fresh image from being written. Returns
the seconds it took, also recorded as `"<name>/precompile_s"`.

`Base.compilecache` is internal: it throws when precompilation fails, but it returns (does not
throw) an exception when the package cannot be precompiled at all; that one is thrown here.
"""
function precompile_package(pkgdir::AbstractString)::Float64
    pkg = identify_in_parent(pkgdir)
    result = nothing
    seconds = @elapsed result = Base.compilecache(pkg)
    result isa Exception && throw(result)
    record_timing!(string(pkg.name, "/precompile_s"), seconds)
    return seconds
end

"""
    identify_in_parent(pkgdir) -> Base.PkgId

The package at `pkgdir`, found by name once its parent directory is on `LOAD_PATH` (as a
package directory).
"""
function identify_in_parent(pkgdir::AbstractString)::Base.PkgId
    path = normpath(String(pkgdir))
    parent, name = dirname(path), basename(path)
    parent in LOAD_PATH || push!(LOAD_PATH, parent)
    pkg = Base.identify_package(name)
    pkg === nothing && throw(ArgumentError("no package \"$(name)\" found in $(parent)"))
    return pkg
end

"""
    load_precompiled(pkgdir) -> Module

Load (precompiling on first use) a package written by [`write_precompile_package`](@ref).
Its parent directory is added to `LOAD_PATH` as a package directory; its dependencies are
found by UUID in the active (juliapkg) environment. The kernel modules are submodules:
`getfield(pkg, :TullaxK_...)`. The load time is recorded as `"<name>/load_s"`.
"""
function load_precompiled(pkgdir::AbstractString)::Module
    pkg = identify_in_parent(pkgdir)
    loaded = Main
    load_s = @elapsed loaded = Base.require(pkg)
    record_timing!(string(pkg.name, "/load_s"), load_s)
    return loaded
end

function write_atomically(path::AbstractString, text::AbstractString)
    tmp = string(path, ".tmp", getpid())
    write(tmp, text)
    mv(tmp, path; force = true)
    return path
end

package_uuid(name::AbstractString) = uuid5(PACKAGE_UUID_NAMESPACE, String(name))

function project_toml(name::AbstractString)::String
    deps = sort!([KernelAbstractions, Atomix, PrecompileTools]; by = nameof)
    lines = String[
        "name = \"$(name)\"",
        "uuid = \"$(package_uuid(name))\"",
        "version = \"0.1.0\"",
        "",
        "[deps]",
    ]
    append!(lines, ["$(nameof(m)) = \"$(Base.PkgId(m).uuid)\"" for m in deps])
    push!(lines, "", "[compat]")
    for m in deps
        version = pkgversion(m)
        version === nothing || push!(lines, "$(nameof(m)) = \"$(version)\"")
    end
    return join(lines, "\n") * "\n"
end

function package_source(name::AbstractString, files::Vector{String}, calls::Vector{WorkloadCall})::String
    lines = String[
        "# Generated by TullaxBridge.write_precompile_package; do not edit.",
        "module $(name)",
        "",
        "using KernelAbstractions",
        "using Atomix",
        "using PrecompileTools",
        "",
    ]
    append!(lines, ["include(\"$(file)\")" for file in files])
    append!(lines, ["", "@setup_workload begin", "    backend = CPU()", "    @compile_workload begin"])
    foreach(call -> append!(lines, workload_call_lines(call)), calls)
    append!(lines, ["    end", "end", "", "end # module $(name)"])
    return join(lines, "\n") * "\n"
end

"""
    workload_call_lines(call) -> Vector{String}

The workload statement for one launch, indented for the `@compile_workload` block. A
kernel that throws only logs a warning (see [`write_precompile_package`](@ref)).
"""
function workload_call_lines(call::WorkloadCall)::Vector{String}
    names = ["a$(i)" for i in eachindex(call.args)]
    bindings = join(["$(n) = $(workload_value_source(a))" for (n, a) in zip(names, call.args)], ", ")
    ndrange = isempty(call.ndrange) ? "()" : "(" * join(call.ndrange, ", ") * ",)"
    launch = call.launcher ?
        ["                $(call.kernel)(backend, $(join(names, ", ")))"] :
        ["                $(call.kernel)(backend)($(join(names, ", ")); ndrange = $(ndrange))",
         "                KernelAbstractions.synchronize(backend)"]
    return String[
        "        try",
        "            let $(bindings)",
        launch...,
        "            end",
        "        catch err",
        "            @warn \"tullax precompile workload: $(call.kernel) failed; it compiles at first use\" exception = err",
        "        end",
    ]
end

function workload_value_source(arg::WorkloadArg)::String
    arg.dims === nothing && return "$(arg.eltype)($(repr(arg.value)))"
    fill = getfield(Base, arg.eltype) <: Integer ? "zeros" : "ones"
    isempty(arg.dims) && return "$(fill)($(arg.eltype))"
    return "$(fill)($(arg.eltype), $(join(arg.dims, ", ")))"
end
