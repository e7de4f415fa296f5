"""Whether a spec is a pure contraction: a sum of products of plain accesses, what ``jnp.einsum`` computes.

The XLA lowering contracts such a spec with einsum, and the planner gives it to XLA whatever the shapes; the
test lives here, with the spec, so that planning a kernel does not import the XLA lowering."""
from __future__ import annotations

from tullax.spec.ir import Access, Affine, Binary, Expr, Spec


def factors(expr: Expr) -> list[Expr]:
    """The factors of a product (``expr`` itself when it is not one)."""
    if isinstance(expr, Binary) and expr.op == "*":
        return factors(expr.lhs) + factors(expr.rhs)
    return [expr]


def is_contraction(spec: Spec) -> bool:
    """A sum of products of plain accesses (distinct indices in each), a new result, no finaliser: einsum."""
    if spec.redop != "+" or spec.assign != ":=" or spec.finalizer:
        return False
    for factor in factors(spec.body):
        if not isinstance(factor, Access):
            return False
        plain = [i.plain if isinstance(i, Affine) else None for i in factor.idx]
        if None in plain or len(set(plain)) != len(plain):
            return False
    return True

