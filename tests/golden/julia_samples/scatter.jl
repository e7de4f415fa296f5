# out[b,d] := W[ix[b],d] (an embedding lookup; ix holds 0-based rows) and its gradient
# ΔW[ix[b],d] += Δout[b,d], a scatter: two b may share a row, so the update is atomic.
module TullaxSampleScatter

using KernelAbstractions
using Atomix

@kernel function gather_fwd!(out, @Const(W), @Const(ix))
    (d, b) = @index(Global, NTuple)
    out[d, b] = W[d, ix[b] + 1]
end

@kernel function gather_grad_W!(dW, @Const(dout), @Const(ix))
    (d, b) = @index(Global, NTuple)
    Atomix.@atomic dW[d, ix[b] + 1] += dout[d, b]
end

function gather_grad!(backend, dW, dout, ix)
    gather_grad_W!(backend)(dW, dout, ix; ndrange = size(dout))
    KernelAbstractions.synchronize(backend)
    return nothing
end

end # module
