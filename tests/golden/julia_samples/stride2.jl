# z[i] := x[2i] + x[2i+1] and Δx[m] := Δz[m/2 when m even] + Δz[(m-1)/2 when m odd]:
# index inversion with divisibility guards, no atomics. Indices below are 0-based p = m - 1.
module TullaxSampleStride2

using KernelAbstractions

@kernel function stride2_fwd!(z, @Const(x))
    i = @index(Global, Linear)
    z[i] = x[2 * (i - 1) + 1] + x[2 * (i - 1) + 2]
end

@kernel function stride2_grad_x!(dx, @Const(dz), nz::Int)
    m = @index(Global, Linear)
    p = m - 1
    local acc::Float32 = 0
    if rem(p, 2) == 0 && p ÷ 2 < nz
        acc += dz[p ÷ 2 + 1]
    elseif p % 2 == 1 && (p - 1) ÷ 2 < nz
        acc += dz[div(p - 1, 2) + 1]
    else
        acc += 0f0
    end
    dx[m] = acc
end

end # module
