"""The KernelOps a jitted function runs, read off its jaxpr (shared by the planner's and the expansion's tests)."""
from __future__ import annotations

from typing import Any, Callable


def planned_ops(fn: Callable, *values: Any) -> list:
    """The KernelOps of every tullax kernel in the jaxpr of ``fn``, as lowered to run here (a plan a race may still
    decide is traced pending: its lowering for this host races it, ``primitives._settled``)."""
    import jax

    from tullax.jaxop.primitives import decided

    found = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "tullax_kernel":
                op = eqn.params["op"]
                found.append(decided(op, [v.aval for v in eqn.invars]) if op.pending else op)
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    visit(inner)

    visit(jax.make_jaxpr(fn)(*values).jaxpr)
    return found
