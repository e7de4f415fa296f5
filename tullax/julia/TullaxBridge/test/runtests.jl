# Tests of the Julia half of the bridge.
#
# PythonCall needs a Python. Run them inside tullax's juliacall process (the Python tests
# marked `julia` include this file), or standalone with the project's own Python:
#
#   JULIA_CONDAPKG_BACKEND=Null JULIA_PYTHONCALL_EXE=$(which python) \
#       julia --project=julia/TullaxBridge -e 'using Pkg; Pkg.test()'
#
# (NumPy must be importable by that Python.)

using Test
using TullaxBridge
using KernelAbstractions
using PythonCall

const SAXPY_SOURCE = """
module TullaxTestSaxpy

using KernelAbstractions

@kernel function saxpy!(y, @Const(x), a)
    i = @index(Global, Linear)
    y[i] = a * x[i] + y[i]
end

end
"""

const BARE_SOURCE = """
@kernel function fill_index!(out)
    (j, i) = @index(Global, NTuple)
    out[j, i] = 10 * i + j
end
"""

# What tullax's printer emits: a kernel over a reversed, 1-based view and its host launcher.
const LAUNCHER_SOURCE = """
module TullaxTestLauncher

using KernelAbstractions
using Atomix

@kernel function kernel!(a0, @Const(a1), s0::Float64, n0::Int, n1::Int)
    (g1, g0) = @index(Global, NTuple)
    i0 = g0 - 1
    i1 = g1 - 1
    @inbounds begin
        a0[i0 + 1, i1 + 1] = Float32(s0) * a1[i1 + 1, i0 + 1]
    end
end

function run_kernel!(backend, a0, a1, s0, n0, n1)
    if (n1 > 0 && n0 > 0)
        kernel!(backend)(a0, a1, s0, n0, n1; ndrange = (n1, n0))
    end
    KernelAbstractions.synchronize(backend)
    return nothing
end

end
"""

@testset "TullaxBridge" begin
    @testset "load_kernels evaluates a printed module and launch! runs it" begin
        clear_timings!()
        mod = load_kernels(SAXPY_SOURCE, "TullaxTestSaxpy")
        @test nameof(mod) == :TullaxTestSaxpy
        x = collect(Float32, 1:8)
        y = ones(Float32, 8)
        elapsed = launch!(mod, :saxpy!, backend_for("cpu"), y, x, 2.0f0; ndrange = length(y))
        @test elapsed >= 0
        @test y == 2.0f0 .* x .+ 1.0f0
        first = timings()
        @test haskey(first, "TullaxTestSaxpy/parse_s")
        @test haskey(first, "TullaxTestSaxpy/eval_s")
        @test first["TullaxTestSaxpy.saxpy!/launches"] == 1.0
        launch!(mod, "saxpy!", CPU(), y, x, 0.0f0; ndrange = (8,), workgroupsize = 4)
        second = timings()
        @test second["TullaxTestSaxpy.saxpy!/launches"] == 2.0
        @test second["TullaxTestSaxpy.saxpy!/first_run_s"] == first["TullaxTestSaxpy.saxpy!/first_run_s"]
    end

    @testset "bare definitions land in the container module" begin
        mod = load_kernels(BARE_SOURCE, "TullaxTestBare")
        out = zeros(Int, 3, 2)
        launch!(mod, :fill_index!, CPU(), out; ndrange = size(out))
        @test out == [10 * i + j for j in 1:3, i in 1:2]
    end

    @testset "syntax errors name the module" begin
        err = try
            load_kernels("@kernel function broken(", "TullaxTestBroken")
            nothing
        catch e
            e
        end
        @test err isa ArgumentError
        @test occursin("TullaxTestBroken", sprint(showerror, err))
    end

    @testset "wrap_cpu is a zero-copy view with reversed dimensions" begin
        np = pyimport("numpy")
        a = np.arange(6; dtype = "float32").reshape(2, 3)
        v = wrap_cpu(a)
        @test size(v) == (3, 2)
        @test v[3, 1] == 2.0f0          # a[0, 2]
        v[1, 2] = 42.0f0                # a[1, 0]
        @test pyconvert(Float32, a[1, 0]) == 42.0f0
        @test_throws ArgumentError wrap_cpu(a.T)
    end

    @testset "launch_cpu! wraps PyArrays" begin
        np = pyimport("numpy")
        mod = load_kernels(SAXPY_SOURCE, "TullaxTestSaxpyPy")
        x = np.arange(4; dtype = "float32")
        y = np.ones(4; dtype = "float32")
        launch_cpu!(mod, "saxpy!", PyArray(y), PyArray(x), 3.0f0; ndrange = 4)
        @test pyconvert(Vector{Float32}, y.tolist()) == Float32[1, 4, 7, 10]
        # A Python list arrives as a PyList{Py}: its items are Py objects, converted by as_dims.
        launch_cpu!(mod, "saxpy!", PyArray(y), PyArray(x), 1.0f0; ndrange = pyconvert(Any, pylist([4])),
                    workgroupsize = pyconvert(Any, pylist([2])))
        @test pyconvert(Vector{Float32}, y.tolist()) == Float32[1, 5, 9, 13]
    end

    @testset "run_launcher_cpu! calls a printed launcher on zero-copy views" begin
        np = pyimport("numpy")
        mod = load_kernels(LAUNCHER_SOURCE, "TullaxTestLauncher")
        a = np.arange(6; dtype = "float32").reshape(2, 3)   # T[j,i] := s*A[i,j]
        t = np.zeros((3, 2); dtype = "float32")
        elapsed = run_launcher_cpu!(mod, "run_kernel!", PyArray(t), PyArray(a), 2.0, 2, 3)
        @test elapsed >= 0
        @test pyconvert(Vector{Float32}, t.ravel().tolist()) == Float32[0, 6, 2, 8, 4, 10]
        @test timings()["TullaxTestLauncher.run_kernel!/launches"] == 1.0
    end

    if Base.get_extension(TullaxBridge, :TullaxBridgeCUDAExt) === nothing
        @testset "CUDA entry points explain how to get CUDA.jl" begin
            @test_throws ErrorException backend_for("cuda")
            @test_throws ErrorException run_launcher_cuda!(nothing, "run_kernel!")
        end
    end
    @test_throws ArgumentError backend_for("tpu")

    @testset "write_precompile_package writes a loadable package" begin
        dir = mktempdir()
        signature = ("TullaxTestSaxpy.saxpy!", false, (4,), (("Float32", (4,)), ("Float32", (4,)), ("Float32", 2.0)))
        path = write_precompile_package(dir, "TullaxTestKernels", (SAXPY_SOURCE,), (signature,))
        @test isfile(joinpath(path, "Project.toml"))
        @test isfile(joinpath(path, "src", "kernels_1.jl"))
        main_source = read(joinpath(path, "src", "TullaxTestKernels.jl"), String)
        @test occursin("@compile_workload", main_source)
        @test occursin("TullaxTestSaxpy.saxpy!(backend)(a1, a2, a3; ndrange = (4,))", main_source)
        pkg = load_precompiled(path)
        kernels = TullaxBridge.latest_binding(pkg, :TullaxTestSaxpy)
        y = ones(Float32, 4)
        launch!(kernels, :saxpy!, CPU(), y, ones(Float32, 4), 1.0f0; ndrange = 4)
        @test y == fill(2.0f0, 4)
        # Exactly what Python sends: juliacall converts each argument with pyconvert(Any, x).
        launcher_call = pyconvert(Any, pyeval("""('TullaxTestLauncher.run_kernel!', True, (),
            (('Float32', (2, 3)), ('Float32', (3, 2)), ('Float64', 1.0), ('Int64', 2), ('Int64', 3)))""", Main))
        @test launcher_call isa Tuple && TullaxBridge.WorkloadCall(launcher_call).launcher
        sources = pyconvert(Any, pytuple([LAUNCHER_SOURCE]))
        @test sources isa Tuple{String}
        launcher_path = write_precompile_package(dir, "TullaxTestLauncherKernels", sources, (launcher_call,))
        launcher_main = read(joinpath(launcher_path, "src", "TullaxTestLauncherKernels.jl"), String)
        @test occursin("TullaxTestLauncher.run_kernel!(backend, a1, a2, a3, a4, a5)", launcher_main)
        @test precompile_package(launcher_path) >= 0
        launcher_pkg = load_precompiled(launcher_path)
        out = zeros(Float32, 2, 3)
        launcher_kernels = TullaxBridge.latest_binding(launcher_pkg, :TullaxTestLauncher)
        launch!(launcher_kernels, :kernel!, CPU(), out, ones(Float32, 3, 2), 3.0, 2, 3;
                ndrange = (3, 2))
        @test out == fill(3.0f0, 2, 3)
        @test_throws ArgumentError write_precompile_package(dir, "bad name", (), ())
        bad_type = ("k", false, (1,), (("String", 1),))
        @test_throws ArgumentError write_precompile_package(dir, "TullaxTestBad", (), (bad_type,))
        # Python lists arrive as PyList{Py} of Py items, which nothing here reads (the audit's B1).
        python_list = pyconvert(Any, pylist([SAXPY_SOURCE]))
        @test python_list isa PyList{Py}
        @test_throws MethodError write_precompile_package(dir, "TullaxTestBad", python_list, ())
        # Index arrays are filled with zeros (the printed kernels index from 0), data arrays with ones.
        gather = TullaxBridge.WorkloadCall(("M.run_k!", true, (), (("Float32", (3,)), ("Int64", (3,)))))
        gather_source = TullaxBridge.package_source("P", String[], [gather])
        @test occursin("a1 = ones(Float32, 3), a2 = zeros(Int64, 3)", gather_source)
    end
end
