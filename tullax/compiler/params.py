"""The parameters of a loop kernel: the compute dtype, and the arrays and scalars named from the spec and the
call's signature (``a0`` the output, ``a1``... the arrays the body reads, ``s0``... its scalars)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tullax.compiler.interface import ArrayArg, ScalarArg
from tullax.compiler.loops import COMPLEX, FLOATS, INDEX, REAL_OF
from tullax.errors import TullaxError
from tullax.spec import ir
from tullax.spec.ir import Spec
from tullax.spec.valuetype import complex_inputs, is_complex, result_is_complex

if TYPE_CHECKING:
    from tullax.spec.signature import Signature


@dataclass(frozen=True)
class Params:
    # the dtype the body's value (and the reduction) is computed in: the result's, or with complex inputs the
    # complex dtype of the result's precision where the body is complex-valued (``abs(z[i,j]) |> sqrt``: a
    # complex64 sum, a float32 result)
    compute: str
    out: ArrayArg
    arrays: tuple[ArrayArg, ...]  # output first, then the arrays read, in spec input order
    scalars: tuple[ScalarArg, ...]
    # An integer result narrower than the int64 the kernel computes in (``int32``, ``uint8``...), else None:
    # before anything that is not arithmetic modulo 2^bits (comparisons, max/min, abs) a value is wrapped to
    # it, so the kernel sees what jnp's narrow arithmetic would (``tullax.compiler.translate``).
    wrap: str | None = None

    @property
    def real(self) -> str:
        """The dtype of real values (the compute dtype's precision)."""
        return REAL_OF.get(self.compute, self.compute)

    def array(self, source: str) -> ArrayArg:
        """The parameter of the input array (or index array) ``source``."""
        return next(a for a in self.arrays if a.source == source and a.role == "in")

    def scalar(self, source: str) -> ScalarArg:
        return next(s for s in self.scalars if s.source == source)


def parameters(spec: Spec, signature: Signature) -> Params:
    """Check that the loop backends can run ``signature`` and name the parameters: only inputs the spec reads
    become parameters (a derived gradient spec lists inputs it only takes shapes from)."""
    compute = str(signature.out_dtype)
    if compute not in (*FLOATS, *COMPLEX, INDEX):
        raise TullaxError(
            f"the loop kernels compute in float32, float64, complex64, complex128 or int64, not {compute}: the host "
            "widens half precision and narrow integers first (Signature.widened)")
    if len(signature.in_dtypes) != len(spec.inputs):
        raise TullaxError(f"signature has {len(signature.in_dtypes)} input dtypes, the spec "
                          f"{len(spec.inputs)} inputs")
    in_dtype = {inp.name: str(dt) for inp, dt in zip(spec.inputs, signature.in_dtypes)}
    names = complex_inputs(spec, in_dtype)
    if compute in FLOATS and is_complex(spec.body, names):  # a real result of a complex body (|> abs)
        if result_is_complex(spec, names):
            raise TullaxError(f"the result of this spec on complex inputs is complex: a {compute} result cannot "
                              "hold it")
        compute = COMPLEX[FLOATS.index(compute)]
    used_arrays = set().union(*(ir.arrays_read(e, spec.lhs) for e in ir.spec_exprs(spec)))
    used_scalars = {node.name for e in ir.spec_exprs(spec) for node in ir.walk(e) if isinstance(node, ir.Param)}
    # '+=' and a scatter add to what is there: the host passes the existing values in the output
    role = "out" if spec.assign in (":=", "=") and not spec.is_scatter else "inout"
    out = ArrayArg("a0", spec.out, len(spec.lhs or ()), str(signature.out_dtype), role)
    arrays, scalars = [out], []
    for inp in spec.inputs:
        if inp.kind in ("array", "index") and inp.name in used_arrays:
            arrays.append(ArrayArg(f"a{len(arrays)}", inp.name, inp.rank, in_dtype[inp.name], "in"))
        elif inp.kind == "scalar" and inp.name in used_scalars:
            scalars.append(ScalarArg(f"s{len(scalars)}", inp.name, in_dtype[inp.name]))
    return Params(compute, out, tuple(arrays), tuple(scalars), _narrow_integer(spec, in_dtype) if compute == INDEX
                  else None)


def _narrow_integer(spec: Spec, in_dtype: dict[str, str]) -> str | None:
    """The integer type the data inputs promote to when it is narrower than int64 (NumPy's promotion, which
    is jnp's for integers)."""
    data = [np.dtype(in_dtype[i.name]) for i in spec.inputs if i.kind in ("array", "scalar")]
    found = np.result_type(*data) if data else np.dtype(INDEX)
    return found.name if found.kind in "iu" and found.itemsize < 8 else None
