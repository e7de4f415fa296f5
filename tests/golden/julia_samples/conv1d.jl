# y[i] := x[i+k] * w[k]  (i in 0:len(x)-len(w), a "valid" correlation)
# Gradients: Δx[m] := Δy[pad(m-k)] * w[k] (guarded: zero outside Δy), Δw[k] := Δy[i] * x[i+k].
module TullaxSampleConv1d

using KernelAbstractions
using Atomix

@kernel function conv_fwd!(y, @Const(x), @Const(w), nw::Int)
    (i,) = @index(Global, NTuple)
    acc = zero(eltype(y))
    for k in 1:nw
        acc += x[i + k - 1] * w[k]
    end
    y[i] = acc
end

@kernel function conv_grad_x!(dx, @Const(dy), @Const(w), ny::Int, nw::Int)
    m = @index(Global, Linear)
    acc = zero(eltype(dx))
    for k in 1:nw
        i = m - k + 1
        if 1 <= i && i <= ny
            @inbounds acc += dy[i] * w[k]
        end
    end
    dx[m] = acc
end

@kernel function conv_grad_w!(dw, @Const(dy), @Const(x), ny::Int)
    I = @index(Global, Cartesian)
    k = I[1]
    acc = zero(eltype(dw))
    @inbounds begin
        for i in 1:ny
            acc += dy[i] * x[i + k - 1]
        end
    end
    dw[I] = acc
end

end # module
