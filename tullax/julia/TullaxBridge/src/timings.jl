# Timings shared with Python: one flat Dict{String,Float64} so that juliacall hands Python
# something `dict(...)` can copy without further conversion.
#
# Keys:
#   "<module>/parse_s"            Meta.parseall of the printed source
#   "<module>/eval_s"             evaluating it (macro expansion of @kernel included)
#   "<module>/load_s"             loading a precompiled kernel package
#   "<module>.<kernel>/first_run_s"  first launch: JIT compilation + run + synchronize
#   "<module>.<kernel>/last_run_s"   most recent launch
#   "<module>.<kernel>/launches"     number of launches so far

const TIMINGS = Dict{String,Float64}()
const TIMINGS_LOCK = ReentrantLock()

"""
    timings() -> Dict{String,Float64}

A copy of every timing recorded so far (seconds, plus launch counts); see the key
conventions at the top of `timings.jl`.
"""
timings() = lock(() -> copy(TIMINGS), TIMINGS_LOCK)

"""
    clear_timings!()

Forget every recorded timing (tests and benchmarks start from a clean slate).
"""
clear_timings!() = lock(() -> empty!(TIMINGS), TIMINGS_LOCK)

record_timing!(key::AbstractString, seconds::Real) =
    lock(() -> (TIMINGS[String(key)] = Float64(seconds)), TIMINGS_LOCK)

"""
    record_launch!(mod, fname, seconds)

Record one launch of kernel `fname` from module `mod`. The first launch of a kernel is the
one that pays for JIT compilation, so it is kept separately as the first-run time.
"""
function record_launch!(mod::Module, fname::Symbol, seconds::Real)
    prefix = string(nameof(mod), ".", fname)
    lock(TIMINGS_LOCK) do
        first_key = prefix * "/first_run_s"
        haskey(TIMINGS, first_key) || (TIMINGS[first_key] = Float64(seconds))
        TIMINGS[prefix*"/last_run_s"] = Float64(seconds)
        TIMINGS[prefix*"/launches"] = get(TIMINGS, prefix * "/launches", 0.0) + 1.0
    end
    return nothing
end
