"""The concrete element types of one call (``Signature``): what the lowering compiles a spec for and every backend
builds and keys its kernels by."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tullax.spec.ir import Spec

# The element type of index arrays whenever only a data dtype is named (generated sources, warming).
INDEX_DTYPE = "int64"


@dataclass(frozen=True)
class Signature:
    """Concrete element types of one call: ``in_dtypes`` follow ``spec.inputs`` (numpy dtype names;
    scalars too), ``out_dtype`` is the result's. Ranks are already in the Spec."""

    in_dtypes: tuple[str, ...]
    out_dtype: str

    @classmethod
    def for_dtype(cls, spec: Spec, dtype: Any) -> "Signature":
        """The signature used when only a data dtype is named: data and scalars in ``dtype``, index arrays
        int64, the result in ``dtype``."""
        from tullax.spec.dtypes import dtype_name

        name = dtype_name(dtype)
        return cls(tuple(INDEX_DTYPE if i.kind == "index" else name for i in spec.inputs), name)

    @classmethod
    def of_values(cls, values: Sequence[Any], out_dtype: Any) -> "Signature":
        """The signature of a call on ``values`` (NumPy or jax arrays, NumPy scalars, tracers: anything with a
        ``dtype``), one per spec input, with a result of ``out_dtype``."""
        return cls(tuple(np.dtype(v.dtype).name for v in values), np.dtype(out_dtype).name)

    def widened(self) -> "Signature":
        """The signature the loop kernels compute this call in (``tullax.spec.dtypes.kernel_dtype``): half
        precision data as float32, an integer result as int64; ``self`` when nothing changes. The host converts
        (``tullax.backends.host.WidenedKernel``)."""
        from tullax.spec.dtypes import HALF, kernel_dtype

        wide = Signature(tuple(kernel_dtype(d) if d in HALF else d for d in self.in_dtypes),
                         kernel_dtype(self.out_dtype))
        return self if wide == self else wide
