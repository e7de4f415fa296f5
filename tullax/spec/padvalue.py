"""``x[pad(e, value)]``: a padded read that gives ``value`` (a literal or a scalar) outside the axis, not 0.

The parser writes it as a select around the ordinary padded read,
``ifelse((e >= 0)*(e < size(x,d)), x[pad(e)], value)``: the read itself stays a ``pad`` (guarded exactly
like every other one, so it never touches memory outside x), the condition is linear in the indices (a
symbolic extent rides on an index value, the only way a body reads a size), and the gradient is the
ordinary one inside the axis (the select's derivative) and, for a scalar value, the count of outside reads.
"""
from __future__ import annotations

from tullax.spec.ir import Access, Affine, Binary, Call, Expr, IndexVal, Num, Wrapped
from tullax.spec.sizes import Sym


def padded_read(access: Access, values: list[Expr | None]) -> Expr:
    """``access`` (whose valued axes are plain ``pad``s) read as ``value`` where a valued pad leaves its axis.
    Every value of one access is the same expression (the parser checks)."""
    conds: list[Expr] = []
    value: Expr | None = None
    for axis, (idx, pad_value) in enumerate(zip(access.idx, values)):
        if pad_value is None:
            continue
        assert isinstance(idx, Wrapped) and idx.kind == "pad"
        value = pad_value
        conds.append(Binary(">=", _affine(idx.inner, Sym(0)), Num(0)))
        conds.append(Binary("<", _affine(idx.inner, -Sym.extent(access.array, axis)), Num(0)))
    assert value is not None
    cond = conds[0]
    for more in conds[1:]:
        cond = Binary("*", cond, more)
    return Call("ifelse", (cond, access, value), span=access.span)


def _affine(aff: Affine, extra: Sym) -> Expr:
    """``Σ coef*index + const + extra`` as a body expression; a symbolic constant rides on an index value
    (``(i + c) - i`` when no index has coefficient 1)."""
    const = aff.const + extra
    terms: list[Expr] = []
    placed = False
    for name, coef in aff.terms:
        if coef == 1 and not placed:
            terms.append(IndexVal(name, const))
            placed = True
        else:
            terms.append(Binary("*", Num(coef), IndexVal(name)))
    if not placed:
        name = aff.terms[0][0]
        terms += [IndexVal(name, const), Binary("*", Num(-1), IndexVal(name))]
    out = terms[0]
    for term in terms[1:]:
        out = Binary("+", out, term)
    return out
