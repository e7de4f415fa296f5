# Evaluating printed kernel source into a fresh module.

"""
    load_kernels(src::AbstractString, modname::AbstractString) -> Module

Evaluate the printed kernel source `src` and return the module that holds its kernels.

`src` is either one `module ... end` block (what `tullax.generate_source(...,
backend="julia")` prints) or a sequence of top-level definitions. Either way it is
evaluated inside a fresh anonymous container module that already has
`using KernelAbstractions, Atomix`, so nothing leaks into `Main` and loading the same
source twice gives two independent modules. For a `module` block the inner module is
returned, otherwise the container itself.

A printed `module` block brings its own `using KernelAbstractions` / `using Atomix`,
which Julia resolves through the active environment: both packages are direct
dependencies of tullax's juliapkg environment (`tullax/juliapkg.json`).

Parse and eval times are recorded under `"<modname>/parse_s"` and `"<modname>/eval_s"`
(see [`timings`](@ref)). Because the kernels are defined in a newer world than the caller,
call them through [`launch!`](@ref) or [`run_launcher_cpu!`](@ref), which use
`Base.invokelatest`.
"""
function load_kernels(src::AbstractString, modname::AbstractString)::Module
    parsed = nothing
    parse_s = @elapsed parsed = Meta.parseall(String(src); filename = string(modname, ".jl"))
    throw_if_parse_error(parsed, modname)
    container = fresh_module(modname)
    loaded = container
    eval_s = @elapsed loaded = eval_toplevel(container, parsed)
    record_timing!(string(modname, "/parse_s"), parse_s)
    record_timing!(string(modname, "/eval_s"), eval_s)
    return loaded
end

"""
    fresh_module(modname) -> Module

A new anonymous module named `modname` that sees the exports of KernelAbstractions and
Atomix. The packages are bound to the module objects this bridge already loaded (a
relative `using .X`), so the container does not depend on the load path.
"""
function fresh_module(modname::AbstractString)::Module
    container = Module(Symbol(modname), true)
    Core.eval(container, :(const KernelAbstractions = $KernelAbstractions))
    Core.eval(container, :(const Atomix = $Atomix))
    Core.eval(container, :(using .KernelAbstractions, .Atomix))
    return container
end

"""
    throw_if_parse_error(parsed, modname)

`Meta.parseall` reports syntax errors as `:error` / `:incomplete` expressions inside the
returned `:toplevel` block rather than throwing; turn the first one into an
`ArgumentError` that names the kernel module.
"""
function throw_if_parse_error(parsed, modname::AbstractString)
    for ex in toplevel_statements(parsed)
        if Meta.isexpr(ex, (:error, :incomplete))
            detail = isempty(ex.args) ? "" : string(": ", first(ex.args))
            throw(ArgumentError("printed kernel source $(modname) does not parse$(detail)"))
        end
    end
    return nothing
end

toplevel_statements(ex::Expr) =
    Meta.isexpr(ex, :toplevel) ? filter(x -> !(x isa LineNumberNode), ex.args) : Any[ex]
toplevel_statements(ex) = Any[ex]

"""
    eval_toplevel(container, parsed) -> Module

Evaluate the parsed source in `container`. A source that is a single `module` block
yields that (sub)module; anything else yields the container.
"""
function eval_toplevel(container::Module, parsed)::Module
    statements = toplevel_statements(parsed)
    Core.eval(container, parsed)
    if length(statements) == 1 && Meta.isexpr(only(statements), :module)
        # Expr(:module, std_imports::Bool, name::Symbol, body): the name is its only Symbol.
        inner_name = first(a for a in only(statements).args if a isa Symbol)
        return latest_binding(container, inner_name)::Module
    end
    return container
end
