# Zero-copy views of Python buffers.

"""
    wrap_cpu(pa::PyArray) -> Array
    wrap_cpu(obj::Py) -> Array

A dense column-major `Array` that shares memory with the C-contiguous (row-major) NumPy
or XLA CPU buffer behind `pa`. A row-major array of shape `(a, b)` is exactly the
column-major array of size `(b, a)`, so the view has the reversed size and the printed
kernels index it with reversed indices; no `PermutedDimsArray` and no copy.

juliacall converts NumPy arrays (and CPU `jax.Array`s, via the buffer protocol) passed as
arguments into `PyArray`s. A jax `buffer_callback` `Buffer` only has `__array__`: pass
`np.asarray(buf)` (itself zero-copy) instead.

The returned array does not own its memory. The caller must keep the Python object alive
while the array is in use (hold `pa`, or wrap the use in `GC.@preserve pa`); all bridge
entry points do that for the duration of one launch. Non-contiguous inputs are rejected
rather than silently copied.
"""
function wrap_cpu(pa::PyArray{T,N}) where {T,N}
    is_row_major_contiguous(pa) || throw(ArgumentError(
        "wrap_cpu needs a C-contiguous (row-major) array; got size $(size(pa)) with " *
        "element strides $(strides(pa)). Pass np.ascontiguousarray(x) from Python.",
    ))
    return unsafe_wrap(Array, pointer(pa), reverse(size(pa)))::Array{T,N}
end

wrap_cpu(obj::Py) = wrap_cpu(PyArray(obj; copy = false))

"""
    is_row_major_contiguous(pa::PyArray) -> Bool

True when the elements of `pa` are laid out densely in row-major order. Axes of length 1
are skipped: NumPy leaves their strides arbitrary. Empty arrays hold no elements and are
trivially contiguous.
"""
function is_row_major_contiguous(pa::PyArray)
    any(iszero, size(pa)) && return true
    expected = 1
    for (len, stride) in zip(reverse(size(pa)), reverse(strides(pa)))
        len == 1 || stride == expected || return false
        expected *= len
    end
    return true
end

"""
    cuda_unavailable_error(what) -> ErrorException

The error every CUDA entry point throws while CUDA.jl is not loaded.
"""
cuda_unavailable_error(what::AbstractString) = ErrorException(
    "TullaxBridge.$(what) needs CUDA.jl, which is not loaded. Install it with " *
    "`tullax julia install-cuda` (or `juliapkg.add(\"CUDA\", ...)`), then `using CUDA` " *
    "before calling the CUDA entry points.",
)
