# (logsumexp) l[i] := x[i,j] and Δx[i,j] := Δl[i] * exp(x[i,j] - l[i]).
module TullaxSampleLogsumexp

using KernelAbstractions

@kernel function logsumexp_fwd!(l, @Const(x), nj::Int)
    (i,) = @index(Global, NTuple)
    mx = typemin(eltype(l))
    for j in 1:nj
        mx = max(mx, x[j, i])
    end
    s = zero(eltype(l))
    for j in 1:nj
        s += exp(x[j, i] - mx)
    end
    l[i] = isinf(mx) ? mx : mx + log(s)
end

@kernel function logsumexp_grad_x!(dx, @Const(dl), @Const(x), @Const(l))
    (j, i) = @index(Global, NTuple)
    dx[j, i] = dl[i] * exp(x[j, i] - l[i])
end

end # module
