"""Complex numbers in the CUDA C printer: ``complex64``/``complex128`` as the prelude's ``tx_c64``/``tx_c128``, a
struct of two parts (8- and 16-byte aligned, laid out as NumPy's and XLA's complex elements) with C++ operators.

* The same semantics as the host C printer (``tullax.printers.c_complex``, docs/language.md): ``*`` is the
  textbook product ``(ac - bd) + (ad + bc)i`` (``tx_cmul``, as jnp); ``/`` is C99 Annex G's division (Smith-like
  scaling by a power of two, infinities and zeros recovered from NaN+NaN i), as GCC's ``__divsc3`` and XLA divide:
  ``(1+2i)/0`` is inf+inf i; ``+ - ==`` are per part. A real operand converts implicitly (``x + z``).
* Literals: ``tx_c64(re, im)``, each part a float literal (NaN and infinities as the prelude's ``tx_nan_f32()``).
* Functions: every registry entry with a complex C spelling (``functions.Function.c_complex``) has a device
  overload ``tx_c<name>`` for both types (``tx_cexp``, ``tx_cabs``, ``tx_cconj``, ``tx_creal``...), written with the
  formulas glibc's complex.h uses; integer powers are the shared ``tx_powi`` (repeated squaring with ``*``, as
  ``tx_cpowi``), other powers ``tx_cpow`` (``exp(w log z)``, as ``cpow``).
* Block combines shuffle the two parts (``tx_shfl_xor``) and an ``atomic_add`` store adds each part atomically:
  each part of a sum is a sum of its own.
NVRTC has no complex header; the same text compiles with g++ through the host harness (tests/cuda_host.h).
"""
from __future__ import annotations

from tullax.compiler.loops import COMPLEX, INDEX, BinOp, Call, Const, Expr
from tullax.errors import TullaxError
from tullax.printers.base import Precedence
from tullax.printers.clike import format_float
from tullax.spec import functions

CUDA_COMPLEX_TYPES = {"complex64": "tx_c64", "complex128": "tx_c128"}
_PART = {"complex64": "float32", "complex128": "float64"}


def is_complex(dtype: str) -> bool:
    return dtype in COMPLEX


def spelling(name: str) -> str:
    """The device overload of registry function ``name`` on complex arguments (``tx_cexp``)."""
    entry = functions.get(name)
    if entry.c_complex is None:
        raise TullaxError(f"internal error: the function registry has no complex spelling of {name}")
    return f"tx_c{name}"


class ComplexCuda:
    """The CUDA printer's complex values (mixed in before ``CudaPrinter``'s C printer): their type, literals,
    function calls and non-integer powers; the arithmetic is the struct's operators."""

    def type_name(self, dtype: str) -> str:
        return CUDA_COMPLEX_TYPES[dtype] if is_complex(dtype) else super().type_name(dtype)  # type: ignore[misc]

    def constant(self, node: Const) -> str:
        if is_complex(node.dtype) and not isinstance(node.value, bool):
            value, part = complex(node.value), _PART[node.dtype]
            return (f"{CUDA_COMPLEX_TYPES[node.dtype]}({format_float(value.real, part)}, "
                    f"{format_float(value.imag, part)})")
        return super().constant(node)  # type: ignore[misc]

    def node(self, expr: Expr) -> tuple[str, int]:
        if isinstance(expr, Call) and expr.args and is_complex(expr.args[0].dtype):
            return self.call(spelling(expr.fn), expr.args), Precedence.ATOM  # type: ignore[attr-defined]
        return super().node(expr)  # type: ignore[misc]

    def binary(self, expr: BinOp) -> tuple[str, int]:
        if is_complex(expr.dtype) and expr.op == "^" and not (isinstance(expr.rhs, Const) and expr.rhs.dtype == INDEX):
            return self.call("tx_cpow", (expr.lhs, expr.rhs)), Precedence.ATOM  # type: ignore[attr-defined]
        return super().binary(expr)  # type: ignore[misc]


def _definitions(dtype: str) -> str:
    """The struct, its operators and its functions for ``dtype``."""
    t, r = CUDA_COMPLEX_TYPES[dtype], ("float" if dtype == "complex64" else "double")
    f = "f" if dtype == "complex64" else ""  # the real function's suffix (``expf``)
    part = _PART[dtype]
    one, half, two, zero = (format_float(v, part) for v in (1.0, 0.5, 2.0, 0.0))
    quarter, ln2, ln10 = format_float(0.25, part), format_float(0.6931471805599453, part), \
        format_float(2.302585092994046, part)
    inf = "tx_inf_f32()" if dtype == "complex64" else "tx_inf_f64()"
    big = "9" if dtype == "complex64" else "22"  # |x| past which tanh(x) is +-1 in the part's precision
    other = "" if dtype == "complex64" else f"\n    __device__ __forceinline__ {t}(tx_c64 z) : re(z.re), im(z.im) {{}}"
    narrow = f"\n    __device__ explicit {t}(tx_c128 z);  // defined after tx_c128" if dtype == "complex64" else ""
    d = "__device__ __forceinline__"
    return f"""\
struct alignas({8 if dtype == "complex64" else 16}) {t} {{
    {r} re, im;
    {t}() = default;  // trivial: a __shared__ array of them may not have a constructor to run
    {d} {t}(float x) : re(x), im({zero}) {{}}
    {d} {t}(double x) : re(({r})x), im({zero}) {{}}
    {d} {t}(int x) : re(({r})x), im({zero}) {{}}
    {d} {t}(long long x) : re(({r})x), im({zero}) {{}}
    {d} {t}({r} x, {r} y) : re(x), im(y) {{}}{other}{narrow}
    {d} explicit operator {r}() const {{ return re; }}
    friend {d} {t} operator+({t} a, {t} b) {{ return {t}(a.re + b.re, a.im + b.im); }}
    friend {d} {t} operator-({t} a, {t} b) {{ return {t}(a.re - b.re, a.im - b.im); }}
    friend {d} {t} operator-({t} a) {{ return {t}(-a.re, -a.im); }}
    // the textbook product, as jnp (and the c backend's tx_cmul): (inf+inf i)*1 is NaN+NaN i
    friend {d} {t} operator*({t} a, {t} b) {{ return {t}(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re); }}
    friend {d} {t} operator/({t} a, {t} b) {{ return tx_cdiv(a, b); }}
    friend {d} bool operator==({t} a, {t} b) {{ return a.re == b.re && a.im == b.im; }}
    friend {d} bool operator!=({t} a, {t} b) {{ return !(a == b); }}
    {d} {t}& operator+=({t} b) {{ return *this = *this + b; }}
    {d} {t}& operator-=({t} b) {{ return *this = *this - b; }}
    {d} {t}& operator*=({t} b) {{ return *this = *this * b; }}
    {d} {t}& operator/=({t} b) {{ return *this = *this / b; }}
    // C99 Annex G's division (its example _Cdivd): scaled by a power of two, infinities and zeros recovered
    static {d} {t} tx_cdiv({t} z, {t} w) {{
        {r} a = z.re, b = z.im, c = w.re, e = w.im;
        {r} logbw = logb{f}(fmax{f}(fabs{f}(c), fabs{f}(e)));
        int ilogbw = 0;
        if (fabs{f}(logbw) < {inf}) {{
            ilogbw = (int)logbw;
            c = scalbn{f}(c, -ilogbw);
            e = scalbn{f}(e, -ilogbw);
        }}
        {r} denom = c * c + e * e;
        {r} x = scalbn{f}((a * c + b * e) / denom, -ilogbw);
        {r} y = scalbn{f}((b * c - a * e) / denom, -ilogbw);
        if (x != x && y != y) {{
            if (denom == {zero} && (a == a || b == b)) {{
                x = copysign{f}({inf}, c) * a;
                y = copysign{f}({inf}, c) * b;
            }} else if ((fabs{f}(a) == {inf} || fabs{f}(b) == {inf}) && fabs{f}(c) < {inf} && fabs{f}(e) < {inf}) {{
                a = copysign{f}(fabs{f}(a) == {inf} ? {one} : {zero}, a);
                b = copysign{f}(fabs{f}(b) == {inf} ? {one} : {zero}, b);
                x = {inf} * (a * c + b * e);
                y = {inf} * (b * c - a * e);
            }} else if (logbw == {inf} && fabs{f}(a) < {inf} && fabs{f}(b) < {inf}) {{
                c = copysign{f}(fabs{f}(c) == {inf} ? {one} : {zero}, c);
                e = copysign{f}(fabs{f}(e) == {inf} ? {one} : {zero}, e);
                x = {zero} * (a * c + b * e);
                y = {zero} * (b * c - a * e);
            }}
        }}
        return {t}(x, y);
    }}
}};
{d} {r} tx_creal({t} z) {{ return z.re; }}
{d} {r} tx_cimag({t} z) {{ return z.im; }}
{d} {t} tx_cconj({t} z) {{ return {t}(z.re, -z.im); }}
{d} {r} tx_cabs({t} z) {{ return hypot{f}(z.re, z.im); }}
{d} {t} tx_cexp({t} z) {{
    {r} m = exp{f}(z.re);
    return z.im == {zero} ? {t}(m, z.im) : {t}(m * cos{f}(z.im), m * sin{f}(z.im));
}}
{d} {t} tx_clog({t} z) {{ return {t}(log{f}(hypot{f}(z.re, z.im)), atan2{f}(z.im, z.re)); }}
{d} {t} tx_csqrt({t} z) {{
    if (z.re == {zero} && z.im == {zero}) return {t}({zero}, z.im);
    {r} s = sqrt{f}({half} * (fabs{f}(z.re) + hypot{f}(z.re, z.im)));
    {r} q = z.im / ({two} * s);
    return z.re >= {zero} ? {t}(s, q) : {t}(fabs{f}(q), copysign{f}(s, z.im));
}}
{d} {t} tx_csin({t} z) {{ return {t}(sin{f}(z.re) * cosh{f}(z.im), cos{f}(z.re) * sinh{f}(z.im)); }}
{d} {t} tx_ccos({t} z) {{ return {t}(cos{f}(z.re) * cosh{f}(z.im), -(sin{f}(z.re) * sinh{f}(z.im))); }}
{d} {t} tx_csinh({t} z) {{ return {t}(sinh{f}(z.re) * cos{f}(z.im), cosh{f}(z.re) * sin{f}(z.im)); }}
{d} {t} tx_ccosh({t} z) {{ return {t}(cosh{f}(z.re) * cos{f}(z.im), sinh{f}(z.re) * sin{f}(z.im)); }}
// Kahan's tanh: (1 + t^2) b c + i t over 1 + (1 + t^2) b^2, t = tan y, b = sinh x, c = cosh x; +-1 for large |x|
{d} {t} tx_ctanh({t} z) {{
    if (fabs{f}(z.re) > {big}) {{
        {r} e = exp{f}(-{two} * fabs{f}(z.re));
        return {t}(copysign{f}({one}, z.re), {two} * {two} * sin{f}(z.im) * cos{f}(z.im) * e);
    }}
    {r} t = tan{f}(z.im), b = sinh{f}(z.re), beta = {one} + t * t, c = sqrt{f}({one} + b * b);
    {r} den = {one} + beta * b * b;
    return {t}(beta * c * b / den, t / den);
}}
{d} {t} tx_ctan({t} z) {{ {t} w = tx_ctanh({t}(-z.im, z.re)); return {t}(w.im, -w.re); }}
{d} {t} tx_catan({t} z) {{
    {r} x = z.re, y = z.im;
    {r} re = {half} * atan2{f}({two} * x, ({one} - y) * ({one} + y) - x * x);
    {r} im = {quarter} * log1p{f}({two} * {two} * y / (x * x + ({one} - y) * ({one} - y)));
    return {t}(re, im);
}}
// log(1 + z): log|1+z| = log1p(x(2+x) + y^2)/2 keeps the digits of a small z that log(1 + z) rounds away
{d} {t} tx_clog1p({t} z) {{
    {r} x = z.re, y = z.im;
    if (fabs{f}(x) < {half} && fabs{f}(y) < {half})
        return {t}({half} * log1p{f}(x * ({two} + x) + y * y), atan2{f}(y, {one} + x));
    return tx_clog({t}({one} + x, y));
}}
// exp(z) - 1: the real part exp(x)cos(y) - 1 as expm1(x)cos(y) - 2sin(y/2)^2, without cancellation
{d} {t} tx_cexpm1({t} z) {{
    {r} x = z.re, y = z.im, h = sin{f}({half} * y);
    return {t}(expm1{f}(x) * cos{f}(y) - {two} * h * h, y == {zero} ? y : exp{f}(x) * sin{f}(y));
}}
{d} {t} tx_cexp2({t} z) {{ return tx_cexp(z * {t}({ln2}, {zero})); }}
{d} {t} tx_clog2({t} z) {{ {t} l = tx_clog(z); return {t}(l.re / {ln2}, l.im / {ln2}); }}
{d} {t} tx_clog10({t} z) {{ {t} l = tx_clog(z); return {t}(l.re / {ln10}, l.im / {ln10}); }}
{d} {t} tx_cpow({t} z, {t} w) {{ return tx_cexp(w * tx_clog(z)); }}
{d} {t} tx_shfl_xor(unsigned mask, {t} v, int offset) {{
    return {t}(__shfl_xor_sync(mask, v.re, offset), __shfl_xor_sync(mask, v.im, offset));
}}
{d} {t} atomicAdd({t}* at, {t} v) {{
    {r} re = atomicAdd(&at->re, v.re);
    return {t}(re, atomicAdd(&at->im, v.im));
}}
"""


CUDA_COMPLEX_PRELUDE = """
// complex64/complex128 (tullax.printers.cuda_complex): tx_c64/tx_c128 with the c backend's semantics, the
// textbook product and C99 Annex G's division
struct tx_c128;
""" + _definitions("complex64") + _definitions("complex128") + (
    "__device__ __forceinline__ tx_c64::tx_c64(tx_c128 z) : re(float(z.re)), im(float(z.im)) {}\n")


__all__ = ["CUDA_COMPLEX_PRELUDE", "CUDA_COMPLEX_TYPES", "ComplexCuda", "is_complex", "spelling"]
