# C[i,j] := A[i,k] * B[k,j] and its two gradient kernels, one per input.
# NumPy (row-major) A (I,K), B (K,J), C (I,J) arrive as column-major A (K,I), B (J,K), C (J,I):
# every index list is reversed.
module TullaxSampleMatmul

using KernelAbstractions
using Atomix

@kernel inbounds=true function matmul_fwd!(C, @Const(A), @Const(B), nk::Int)
    (j, i) = @index(Global, NTuple)
    acc = zero(eltype(C))
    for k in 1:nk
        acc += A[k, i] * B[j, k]
    end
    C[j, i] = acc
end

# ΔA[i,k] := ΔC[i,j] * B[k,j]: parallel over A's own indices, reduction over j in a register.
@kernel inbounds=true function matmul_grad_A!(dA, @Const(dC), @Const(B), nj::Int)
    (k, i) = @index(Global, NTuple)
    acc = zero(eltype(dA))
    for j in 1:nj
        acc += dC[j, i] * B[j, k]
    end
    dA[k, i] = acc
end

# ΔB[k,j] := ΔC[i,j] * A[i,k]
@kernel inbounds=true function matmul_grad_B!(dB, @Const(dC), @Const(A), ni::Int)
    (j, k) = @index(Global, NTuple)
    acc = zero(eltype(dB))
    for i in 1:ni
        acc += dC[j, i] * A[k, i]
    end
    dB[j, k] = acc
end

# Host-side launcher: the bridge may call this instead of launching the kernel itself.
function matmul!(backend, C, A, B)
    nk = size(A, 1)
    matmul_fwd!(backend)(C, A, B, nk; ndrange = size(C))
    KernelAbstractions.synchronize(backend)
    return nothing
end

function matmul_grads!(backend, dA, dB, dC, A, B)
    matmul_grad_A!(backend, 64)(dA, dC, B, size(B, 1); ndrange = size(dA))
    matmul_grad_B!(backend)(dB, dC, A, size(A, 2); ndrange = size(dB))
    synchronize(backend)
    return nothing
end

end # module
