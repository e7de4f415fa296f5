# (max) m[i] := x[i,j] and its gradient Δx[i,j] := Δm[i] * (x[i,j] == m[i]) / count[i]:
# ties share the gradient equally, as jax does. NumPy x (I,J) is Julia x (J,I).
module TullaxSampleRowmax

using KernelAbstractions

@kernel function rowmax_fwd!(m, @Const(x), nj::Int)
    i = @index(Global, Linear)
    acc = typemin(eltype(m))
    for j in 1:nj
        acc = max(acc, x[j, i])
    end
    m[i] = acc
end

@kernel function rowmax_grad_x!(dx, @Const(dm), @Const(x), @Const(m), nj::Int)
    (j, i) = @index(Global, NTuple)
    count = 0
    for jj in 1:nj
        count += ifelse(x[jj, i] == m[i], 1, 0)
    end
    dx[j, i] = x[j, i] == m[i] ? dm[i] / count : zero(eltype(dx))
end

end # module
