"""Lower an analysed Spec to loop nests (the loop IR of ``tullax.compiler.loops``).

Decisions taken here (printer-neutral):

* Parallel loops are the output's free indices (a gradient kernel is an ordinary ``:=`` spec, so it is
  parallel over all of its input's indices). For a scatter (``+=`` into computed positions) only indices that
  cannot collide are parallel: one that appears alone (``d``, ``2d+1``, ``pad(d)``) in some left-hand
  position; the others run serially inside each parallel iteration.
* Loop order: parallel loops outermost in left-hand order; then the reductions, ordered so the innermost is
  the index that is unit-stride (last axis, row-major) in the most accesses.
* Reductions accumulate in a register (``Let acc = init``; loops; ``Accum``; finaliser; one ``Store``).
  Initial values: + 0, * 1, max -inf, min +inf. logsumexp runs two passes over the same loops: a max pass,
  then a sum of ``exp(v - m)`` (m replaced by 0 when it is infinite, which makes an all ``-inf`` or empty
  range give ``-inf`` and a ``+inf`` give ``+inf``), result ``m + log(s)``.
* Guards (for ``+`` reductions, whose skipped terms add zero): index comparisons and ``pad`` accesses that
  multiply the whole body become conditions. An equality is SOLVED for a reduced index (``m == 2k``: no loop
  over k, ``k = m // 2`` under a divisibility check), an inequality in a reduced index with the innermost
  position narrows that loop's bounds (``Δy[pad(m-k)]*w[k]``: k runs over ``max(0, m-n+1) : min(K, m+1)``),
  anything else is an ``If`` placed right where its indices are known (around the loops it does not depend
  on). Elsewhere a ``pad`` read is ``Select(in range, load, 0)``.
* Accesses: plain/affine ones are in range by the inferred ranges; ``mod`` wraps with floor semantics,
  ``clamp`` clamps, an indirect ``ix[e]`` is read into a temporary and checked: outside the axis a gather reads
  NaN and a scatter skips the element.
* Loads and calls that do not depend on an inner loop are hoisted into ``Let``s at the loop level where
  their indices are known (never out of a ``Select`` branch or above a guard that protects them).
* ``lower(..., tile=True)`` (CPU printers only, see ``lower``): strip-mine the last parallel index and make it
  the innermost loop, accumulating into the output elements of the tile, when that reads more arrays
  contiguously than the innermost reduction does (a matmul, Dist, the conv1d input gradient). The tile loop is
  the last parallel loop; the output is then also read (``Load`` of the output array). A scatter whose last
  collision-free index is unit-stride in the output (``ΔW[ix[b],d] += Δout[b,d]``) is tiled the same way: tiles
  of d in parallel, the colliding loops serially inside, d innermost, so each thread owns whole cache lines of
  every output row and reads the index array once per row of a tile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterator

from tullax.compiler.loops import (
    BOOL,
    FLOATS,
    INDEX,
    MATH_FUNCTIONS,
    NAN,
    Accum,
    ArrayArg,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    ScalarArg,
    Select,
    SizeArg,
    Stmt,
    Store,
    UnOp,
    Var,
    binop,
    cast,
    conjunction,
    const,
    expr_vars,
    negate,
    walk_expr,
    walk_stmts,
)
from tullax.errors import TullaxError
from tullax.spec import ir
from tullax.spec.ir import (
    Affine,
    Indirect,
    Spec,
    Wrapped,
)
from tullax.spec.sizes import Sym
from tullax.spec.text import format_spec


# =============================================================================================
# Linear conditions over spec indices (guards)
# =============================================================================================
@dataclass(frozen=True)
class Cond:
    """``sum(coef * index) + const`` is ``>= 0`` (rel ``ge``), ``== 0`` (``eq``) or divisible by ``div``."""

    terms: tuple[tuple[str, int], ...]
    const: Sym
    rel: str
    div: int = 1

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)


def _lin(terms: dict[str, int], const: Sym) -> tuple[tuple[str, int], ...]:
    return tuple((n, c) for n, c in terms.items() if c != 0)


def linear_form(expr: ir.Expr) -> tuple[dict[str, int], Sym] | None:
    """``expr`` as an integer linear form over index values, or None (data, division, non-integer numbers)."""
    if isinstance(expr, ir.IndexVal):
        return {expr.name: 1}, expr.offset
    if isinstance(expr, ir.Num):
        return ({}, Sym(expr.value)) if isinstance(expr.value, int) and not isinstance(expr.value, bool) \
            else None
    if isinstance(expr, ir.Unary):
        inner = linear_form(expr.arg)
        return None if inner is None else ({n: -c for n, c in inner[0].items()}, -inner[1])
    if isinstance(expr, ir.Binary) and expr.op in ("+", "-", "*"):
        left, right = linear_form(expr.lhs), linear_form(expr.rhs)
        if left is None or right is None:
            return None
        if expr.op == "*":
            if not left[0] and left[1].is_const:
                left, right = right, left
            if right[0] or not right[1].is_const:
                return None
            k = right[1].const
            return {n: c * k for n, c in left[0].items()}, left[1] * k
        sign = 1 if expr.op == "+" else -1
        terms = dict(left[0])
        for name, coef in right[0].items():
            terms[name] = terms.get(name, 0) + sign * coef
        return terms, (left[1] + right[1] if sign > 0 else left[1] - right[1])
    return None


def comparison_conds(expr: ir.Binary) -> list[Cond] | None:
    """Linear conditions equivalent to an index comparison (None when it is not one, or is ``!=``)."""
    left, right = linear_form(expr.lhs), linear_form(expr.rhs)
    if left is None or right is None or expr.op == "!=":
        return None
    terms = dict(left[0])
    for name, coef in right[0].items():
        terms[name] = terms.get(name, 0) - coef
    diff, neg = terms, {n: -c for n, c in terms.items()}
    const = left[1] - right[1]
    if expr.op == "==":
        return [Cond(_lin(diff, const), const, "eq")]
    if expr.op == ">=":
        return [Cond(_lin(diff, const), const, "ge")]
    if expr.op == ">":
        return [Cond(_lin(diff, const), const - 1, "ge")]
    if expr.op == "<=":
        return [Cond(_lin(neg, const), -const, "ge")]
    return [Cond(_lin(neg, const), -const - 1, "ge")]  # <


def pad_conds(aff: Affine, extent: Sym) -> list[Cond]:
    """``pad(e)`` on an axis of ``extent`` reads inside iff e is divisible by div and 0 <= e/div < extent,
    i.e. (e divisible) and e >= 0 and div*(extent-1) - e >= 0."""
    terms = dict(aff.terms)
    conds = []
    if aff.div > 1:
        conds.append(Cond(aff.terms, aff.const, "div", aff.div))
    conds.append(Cond(aff.terms, aff.const, "ge"))
    top = extent * aff.div - aff.div
    conds.append(Cond(_lin({n: -c for n, c in terms.items()}, top), top - aff.const, "ge"))
    return conds


def body_factors(expr: ir.Expr) -> Iterator[ir.Expr]:
    """The multiplicative factors of the whole body: through ``*``, the numerator of ``/`` and unary minus."""
    if isinstance(expr, ir.Binary) and expr.op == "*":
        yield from body_factors(expr.lhs)
        yield from body_factors(expr.rhs)
    elif isinstance(expr, ir.Binary) and expr.op == "/":
        yield from body_factors(expr.lhs)
    elif isinstance(expr, ir.Unary):
        yield from body_factors(expr.arg)
    else:
        yield expr


# =============================================================================================
# Loop order
# =============================================================================================
def stride_scores(spec: Spec) -> dict[str, tuple[int, ...]]:
    """Per index, how many accesses use it on the last axis, the one before, ... (higher: more unit-stride)."""
    found: dict[str, list[int]] = {name: [0] * 8 for name in spec.indices}
    items = [(a.array, a.idx) for a in ir.accesses(spec.body)]
    if spec.lhs is not None:
        items.append((spec.out, spec.lhs))
    for _, idx in items:
        for depth, one in enumerate(reversed(idx)):
            for name, _ in ir.idx_affine(one).terms:
                if name in found and depth < 8:
                    found[name][depth] += 1
    return {name: tuple(v) for name, v in found.items()}


def inner_loop_score(accesses: list[tuple], name: str) -> int:
    """How well an innermost loop over ``name`` reads: +1 per access contiguous in it (``name`` with
    coefficient 1 on the last axis only), -1 per access strided in it, 0 for accesses it does not move."""
    score = 0
    for idx in accesses:
        axes = [ir.idx_affine(i).coef(name) for i in idx]
        if not any(axes):
            continue
        last = idx[-1]
        contiguous = axes[-1] == 1 and not any(axes[:-1]) and not isinstance(last, Indirect) and (
            ir.idx_affine(last).div == 1)
        score += 1 if contiguous else -1
    return score


def collision_free(spec: Spec) -> tuple[str, ...]:
    """Indices of a scatter that alone determine some left-hand position (distinct values never collide)."""
    names: list[str] = []
    for idx in spec.lhs or ():
        aff = idx.inner if isinstance(idx, Wrapped) and idx.kind == "pad" else idx
        if isinstance(aff, Affine) and aff.div == 1 and len(aff.terms) == 1 and aff.terms[0][0] not in names:
            names.append(aff.terms[0][0])
    return tuple(names)


def loop_order(spec: Spec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parallel indices, serial indices innermost last)."""
    parallel = collision_free(spec) if spec.is_scatter else spec.free
    scores = stride_scores(spec)
    serial = [n for n in spec.indices if n not in parallel]
    serial.sort(key=lambda n: scores[n])  # stable: ties keep spec order
    return tuple(parallel), tuple(serial)


# =============================================================================================
# The lowering
# =============================================================================================
INITIAL = {"+": 0.0, "*": 1.0, "max": -math.inf, "min": math.inf}


@dataclass
class _Item:
    """A statement placed at a loop level: Let (rank 0 solved index, 2 index temporary, 4 hoisted value) or a
    guard (rank 1 linear, 3 other) that wraps everything after it at that level and deeper."""

    level: int
    rank: int
    stmt: Let | None = None
    guard: Expr | None = None
    seq: int = 0


@dataclass
class _Loop:
    name: str  # spec index
    var: str  # generated loop variable
    start: Expr
    stop: Expr
    parallel: bool


@dataclass
class _State:
    items: list[_Item] = field(default_factory=list)
    levels: dict[str, int] = field(default_factory=dict)  # generated variable -> level
    temps: dict = field(default_factory=dict)  # expression -> temp name (CSE of hoisted values)


TILE = "<tile>"  # the pseudo index of the tile loop of a tiled kernel


def lower(spec: Spec, signature, name: str = "kernel", *, tile: bool = False) -> LoopKernel:
    """The loop-nest kernel of ``spec`` for ``signature`` (a ``backends.base.Signature``).

    ``tile=True`` (CPU printers): when the innermost reduction index is strided but the last parallel index j
    is unit-stride in more accesses (``D[i,j] := (W[k,i]-X[k,j])^2``, a matmul), j is strip-mined: a parallel
    loop over tiles of j, the reductions inside it, and j innermost over the tile, accumulating straight into
    the output elements of the tile (initialised first, finalised after), so the inner loop is contiguous and
    vectorises. Only without guards on j and for + * max min reductions (and '+=' only with + and no
    finaliser). A scatter is tiled when its last parallel (collision-free) index is the last output axis and
    colliding loops run inside it: tiles own disjoint output columns, so it stays race-free. A GPU printer
    keeps the default: one element per work item."""
    return _Lowering(spec, signature, name, tile).kernel()


SCATTER_TILE_BYTES = 128  # 64 B pays more per-row overhead; 256 B leaves too few tiles on many cores


def tile_size(parallel_count: int, dtype: str, scatter: bool = False) -> int:
    """Elements of j per tile: 2 KiB of output (L1-resident with its input rows); smaller with a single
    parallel loop, whose tiles are then the only parallelism. A scatter's tile is one row segment per colliding
    iteration, streamed rather than kept: 128 bytes (two cache lines, so tiles never share one when the row
    starts on a line) leaves 4 tiles per thread on 2 threads for a 256-wide embedding."""
    if scatter:
        return SCATTER_TILE_BYTES // (4 if dtype == "float32" else 8)
    size = 512 if dtype == "float32" else 256
    return size if parallel_count > 1 else 64


class _Lowering:
    def __init__(self, spec: Spec, signature, name: str, tile: bool = False):
        self.spec, self.name, self.allow_tile = spec, name, tile
        self.tile: str | None = None  # the strip-mined parallel index, when tiled
        self.compute = str(signature.out_dtype)
        if self.compute not in FLOATS:
            raise TullaxError(
                f"the loop backends compute in float32 or float64, not {self.compute}: pass float arrays "
                "(or use backend='xla')")
        if len(signature.in_dtypes) != len(spec.inputs):
            raise TullaxError(f"signature has {len(signature.in_dtypes)} input dtypes, the spec "
                              f"{len(spec.inputs)} inputs")
        self.in_dtype = {inp.name: str(dt) for inp, dt in zip(spec.inputs, signature.in_dtypes)}
        self.tile_elems = tile_size(len(spec.free), self.compute, spec.is_scatter)
        for inp in spec.inputs:
            if inp.kind in ("array", "scalar") and self.in_dtype[inp.name].startswith("complex"):
                raise TullaxError("complex inputs are not supported by the loop backends; use backend='xla'")
        self.var_of = {index: f"i{n}" for n, index in enumerate(spec.indices)}
        self.var_of[TILE] = "tile"
        self.ranges = spec.range_of
        self.sizes: dict[Sym, SizeArg] = {}
        self.counter = 0
        self._name_arrays()
        parallel, serial = loop_order(spec)
        self.parallel, self.serial = parallel, list(serial)
        self.solved: dict[str, int] = {}  # spec index -> level of its Let

    # -- names and parameters ------------------------------------------------------------------
    def _name_arrays(self) -> None:
        spec = self.spec
        used_arrays = ir.arrays_read(spec.body, spec.lhs)
        used_scalars = {node.name for node in ir.walk(spec.body) if isinstance(node, ir.Param)}
        role = "out" if spec.assign in (":=", "=") and not spec.is_scatter else "inout"
        self.out = ArrayArg("a0", spec.out, len(spec.lhs or ()), self.compute, role)
        arrays, scalars = [self.out], []
        self.array_of: dict[str, ArrayArg] = {}
        for inp in spec.inputs:
            if inp.kind in ("array", "index") and inp.name in used_arrays:
                arg = ArrayArg(f"a{len(arrays)}", inp.name, inp.rank, self.in_dtype[inp.name], "in")
                arrays.append(arg)
                self.array_of[inp.name] = arg
            elif inp.kind == "scalar" and inp.name in used_scalars:
                scalars.append(ScalarArg(f"s{len(scalars)}", inp.name, self.in_dtype[inp.name]))
        self.arrays, self.scalars = tuple(arrays), tuple(scalars)
        self.scalar_of = {s.source: s for s in scalars}

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter - 1}"

    def size(self, sym: Sym) -> Expr:
        """An integer expression for a symbolic size: a constant, or a size parameter plus a constant."""
        return self.linear((), sym)

    def _size_param(self, sym: Sym) -> tuple[Var, int]:
        """The parameter holding the symbolic part of ``sym`` (sign-normalised: -size(x,0) reuses size(x,0))."""
        base = Sym(0, sym.terms)
        sign = -1 if all(c < 0 for _, c in base.terms) else 1
        base = base * sign
        if base not in self.sizes:
            self.sizes[base] = SizeArg(f"n{len(self.sizes)}", base)
        return Var(self.sizes[base].name, INDEX), sign

    def index_var(self, name: str) -> Var:
        return Var(self.var_of[name], INDEX)

    def linear(self, terms, const_part: Sym) -> Expr:
        """``sum(coef * index) + const`` as an integer expression (positive terms first when there are any)."""
        parts: list[tuple[Expr, int]] = []
        for name, coef in terms:
            term: Expr = self.index_var(name)
            parts.append((term if abs(coef) == 1 else binop("*", const(abs(coef)), term), 1 if coef > 0 else -1))
        if not const_part.is_const:
            parts.append(self._size_param(const_part))
        parts.sort(key=lambda p: -p[1])  # stable: a leading positive term avoids a negation
        out: Expr | None = None
        for term, sign in parts:
            if out is None:
                out = term if sign > 0 else UnOp("neg", term, INDEX)
            else:
                out = binop("+" if sign > 0 else "-", out, term)
        if out is None:
            return const(const_part.const)
        return binop("+", out, const(const_part.const))

    def extent(self, array: str, axis: int) -> Expr:
        return self.size(Sym.extent(array, axis))

    # -- levels --------------------------------------------------------------------------------
    def loops(self) -> list[str]:
        tiled = [self.tile] if self.tile else []
        return list(self.parallel) + [n for n in self.serial if n not in self.solved] + tiled

    def level_of(self, names) -> int:
        """The loop level where all of ``names`` (spec indices) are known (at least the innermost parallel)."""
        order = self.loops()
        top = len(self.parallel) - 1
        levels = [order.index(n) if n in order else self.solved[n] for n in names]
        return max([top] + levels)

    def expr_level(self, expr: Expr) -> int:
        top = len(self.parallel) - 1
        return max([top] + [self.state.levels.get(v, top) for v in expr_vars(expr)])

    def add_item(self, item: _Item) -> None:
        item.seq = len(self.state.items)
        self.state.items.append(item)

    # -- the kernel ----------------------------------------------------------------------------
    def kernel(self) -> LoopKernel:
        spec = self.spec
        self.state = _State()
        body = spec.body
        lhs_conds: list[Cond] = []
        factor_conds: list[Cond] = []
        generic: list[ir.Expr] = []
        if spec.redop == "+":
            body, factor_conds, generic = self._extract_guards(body)
        if spec.is_scatter:
            lhs_conds = [c for axis, idx in enumerate(spec.lhs) if isinstance(idx, Wrapped)
                         and idx.kind == "pad" for c in pad_conds(idx.inner, Sym.extent(spec.out, axis))]
        conds = factor_conds + lhs_conds
        conds = self._solve_equalities(conds)
        if self.allow_tile and self._tiling_pays(conds, generic):
            self.tile = self.parallel[-1]
            self.parallel = self.parallel[:-1] + (TILE,)
        self._set_levels()
        bounds = self._narrow(conds)
        for expr in generic:
            cond = self.as_bool(self.translate(expr))
            self.add_item(_Item(self.expr_level(cond), 3, guard=cond))
        if spec.is_scatter:
            stmts = self._scatter_body(body, bounds)
        else:
            stmts = self._reduction_body(body, bounds)
        used = _stmt_vars(stmts)
        return LoopKernel(
            name=self.name, spec_text=format_spec(spec).replace("\n", " "), arrays=self.arrays,
            scalars=tuple(self.scalars), sizes=tuple(s for s in self.sizes.values() if s.name in used),
            body=tuple(stmts),
            compute_dtype=self.compute, is_scatter=spec.is_scatter)

    def _tiling_pays(self, conds: list[Cond], generic: list[ir.Expr]) -> bool:
        """Tile the last parallel index j when that makes the innermost loop read more arrays contiguously
        than the innermost reduction loop does (and nothing but inequalities, which narrow j, guards j)."""
        spec = self.spec
        if not self.parallel or spec.redop == "logsumexp":
            return False
        if spec.assign == "+=" and (spec.redop != "+" or spec.finalizer):
            return False
        serial = [n for n in self.serial if n not in self.solved]
        if not serial:
            return False
        j = self.parallel[-1]
        guarded = {n for c in conds if c.rel != "ge" for n in c.names()}
        guarded |= {n for _, c, _ in self.solutions for n in c.names()}
        guarded |= {n.name for g in generic for n in ir.walk(g) if isinstance(n, ir.IndexVal)}
        if j in guarded:
            return False
        reads = [a.idx for a in ir.accesses(spec.body)]
        if spec.is_scatter:
            return self._scatter_tiling_pays(j, reads, serial[-1])
        tiled, untiled = inner_loop_score(reads + [spec.lhs], j), inner_loop_score(reads, serial[-1])
        return tiled > untiled or (tiled == untiled and tiled > 0 and self._sliding_window(j, serial[-1]))

    def _scatter_tiling_pays(self, j: str, reads: list[tuple], k: str) -> bool:
        """A scatter tiles j only when j alone is the last output axis: then tiles of j write disjoint output
        elements (race-free whatever the colliding loops do) and contiguous row segments (no shared cache
        lines between threads); and only when j innermost reads better than the colliding k innermost."""
        last = self.spec.lhs[-1]
        aff = last.inner if isinstance(last, Wrapped) and last.kind == "pad" else last
        if not (isinstance(aff, Affine) and aff.div == 1 and aff.terms == ((j, 1),)):
            return False
        if any(ir.idx_affine(i).coef(j) for i in self.spec.lhs[:-1]):
            return False
        accesses = reads + [self.spec.lhs]
        return inner_loop_score(accesses, j) > inner_loop_score(accesses, k)

    def _sliding_window(self, j: str, k: str) -> bool:
        """``x[j+k]`` with j's range shrunk by k's extent (a valid convolution): the reduction is a short
        filter and neighbouring j reuse the same inputs, so a tie goes to tiling."""
        together = any(ir.idx_affine(i).coef(j) and ir.idx_affine(i).coef(k)
                       for a in ir.accesses(self.spec.body) for i in a.idx)
        filter_atoms = {atom for atom, _ in self.ranges[k].extent().terms}
        shrunk = any(atom in filter_atoms and coef < 0 for atom, coef in self.ranges[j].extent().terms)
        return together and shrunk

        # -- guards ----------------------------------------------------------------------------------
    def _extract_guards(self, body: ir.Expr):
        """Split index comparisons and pad reads that multiply the whole body off into conditions."""
        conds: list[Cond] = []
        generic: list[ir.Expr] = []
        replace_map: dict[int, ir.Expr] = {}
        for factor in body_factors(body):
            if isinstance(factor, ir.Binary) and factor.op in ir.COMPARISONS:
                found = comparison_conds(factor)
                if found is not None:
                    conds += found
                    replace_map[id(factor)] = ir.Num(1)
                elif factor.op == "!=" and linear_form(factor.lhs) and linear_form(factor.rhs):
                    generic.append(factor)
                    replace_map[id(factor)] = ir.Num(1)
            elif isinstance(factor, ir.Access) and any(
                    isinstance(i, Wrapped) and i.kind == "pad" for i in factor.idx):
                new_idx = []
                for axis, idx in enumerate(factor.idx):
                    if isinstance(idx, Wrapped) and idx.kind == "pad":
                        conds += pad_conds(idx.inner, Sym.extent(factor.array, axis))
                        new_idx.append(idx.inner)  # in range under the guard (div > 1: exact division)
                    else:
                        new_idx.append(idx)
                replace_map[id(factor)] = replace(factor, idx=tuple(new_idx))
        if not replace_map:
            return body, conds, generic
        return _replace_nodes(body, replace_map), conds, generic

    def _solve_equalities(self, conds: list[Cond]) -> list[Cond]:
        """Solve ``eq`` conditions for a serial index: its loop disappears, a Let and range guards remain."""
        rest: list[Cond] = []
        pending = list(conds)
        self.solutions: list[tuple[str, Cond, int]] = []
        self.frozen: set[str] = set()
        while pending:
            cond = pending.pop(0)
            target = self._solve_target(cond) if cond.rel == "eq" else None
            if target is None:
                rest.append(cond)
                continue
            coef = cond.coef(target)
            self.solved[target] = -2  # placeholder until levels are known
            if abs(coef) != 1:  # the others stay in later conditions: never solve them, no cycles
                self.frozen |= set(cond.names()) - {target}
            self.solutions.append((target, cond, coef))
            lo_hi = self.ranges[target]
            rng = [Cond(((target, 1),), -lo_hi.lo, "ge"), Cond(((target, -1),), lo_hi.hi - 1, "ge")]
            if abs(coef) == 1:  # substitute target = -(rest)/coef into every other condition: stays linear
                pending = [_substitute(c, target, cond) for c in pending + rng]
                rest = [_substitute(c, target, cond) for c in rest]
            else:
                others = tuple((n, c) for n, c in cond.terms if n != target)
                rest.append(Cond(others, cond.const, "div", abs(coef)))
                pending += rng
        return rest

    def _solve_target(self, cond: Cond) -> str | None:
        order = self.serial
        candidates = [n for n in cond.names() if n in order and n not in self.solved and n not in self.frozen]
        if not candidates:
            return None
        candidates.sort(key=lambda n: (abs(cond.coef(n)) == 1, order.index(n)))
        return candidates[-1]

    def _set_levels(self) -> None:
        """Give every solved index the level where its solution is known, emit its Let, set var levels."""
        order = self.loops()
        for level, name in enumerate(order):
            self.state.levels[self.var_of[name]] = level
        for target, cond, coef in _dependency_order(self.solutions):
            others = [n for n in cond.names() if n != target]
            level = self.level_of(others)
            self.solved[target] = level
            self.state.levels[self.var_of[target]] = level
            rest = self.linear(tuple((n, c) for n, c in cond.terms if n != target), cond.const)
            # coef*t + rest == 0  ->  t = -rest / coef (exact: a divisibility guard comes with |coef| > 1)
            if coef == 1:
                value = binop("-", const(0), rest)
            elif coef == -1:
                value = rest
            else:
                value = binop("//", binop("-", const(0), rest) if coef > 0 else rest, const(abs(coef)))
            self.add_item(_Item(level, 0, stmt=Let(self.var_of[target], value)))

    def _narrow(self, conds: list[Cond]) -> dict[str, list[tuple[str, Expr]]]:
        """Inequalities in the innermost serial loop index narrow its bounds; the rest become guards."""
        order = self.loops()
        bounds: dict[str, list[tuple[str, Expr]]] = {}
        for cond in conds:
            if not cond.terms:
                cond_expr = self.cond_expr(cond)
                self.add_item(_Item(len(self.parallel) - 1, 1, guard=cond_expr))
                continue
            inner = max(cond.names(), key=lambda n: order.index(n) if n in order else self.solved[n])
            coef = cond.coef(inner)
            if cond.rel == "ge" and inner in order and inner not in self.parallel:
                others = tuple((n, c) for n, c in cond.terms if n != inner)
                bounds.setdefault(inner, []).append(self._bound(coef, others, cond.const))
            else:
                cond_expr = self.cond_expr(cond)
                self.add_item(_Item(self.expr_level(cond_expr), 1, guard=cond_expr))
        return bounds

    def _bound(self, coef: int, others, const_part: Sym) -> tuple[str, Expr]:
        """``coef*v + rest >= 0`` as a bound on v: ``v >= ceil(-rest/coef)`` or ``v < floor(rest/-coef) + 1``."""
        if coef == 1:
            return "start", self.linear(tuple((n, -c) for n, c in others), -const_part)
        if coef == -1:
            return "stop", self.linear(others, const_part + 1)
        rest = self.linear(others, const_part)
        if coef > 0:
            return "start", negate(binop("//", rest, const(coef)))
        return "stop", binop("+", binop("//", rest, const(-coef)), const(1))

    def cond_expr(self, cond: Cond) -> Expr:
        """The condition as a comparison, solved for a unit-coefficient index when there is one."""
        if cond.rel != "div":
            unit = [n for n, c in cond.terms if abs(c) == 1]
            if unit:
                name = unit[-1]
                coef = cond.coef(name)
                others = tuple((n, -c * coef) for n, c in cond.terms if n != name)
                rhs = self.linear(others, -cond.const * coef)  # v == rhs, or v >= rhs / v <= rhs
                if cond.rel == "eq":
                    return binop("==", self.index_var(name), rhs)
                if coef > 0:
                    return binop(">=", self.index_var(name), rhs)
                return binop("<", self.index_var(name), binop("+", rhs, const(1)))
        value = self.linear(cond.terms, cond.const)
        if cond.rel == "ge":
            return binop(">=", value, const(0))
        if cond.rel == "eq":
            return binop("==", value, const(0))
        return binop("==", binop("mod", value, const(cond.div)), const(0))

    # -- body translation ------------------------------------------------------------------------
    def to_compute(self, expr: Expr) -> Expr:
        return cast(expr, self.compute)

    def as_bool(self, expr: Expr) -> Expr:
        if expr.dtype == BOOL:
            return expr
        return binop("!=", expr, cast(const(0), expr.dtype) if expr.dtype != INDEX else const(0))

    def unify(self, a: Expr, b: Expr) -> tuple[Expr, Expr]:
        """Both integer: stay integer; otherwise both in the compute dtype (bools become 0/1)."""
        if a.dtype == INDEX and b.dtype == INDEX:
            return a, b
        return self.to_compute(a), self.to_compute(b)

    def translate(self, expr: ir.Expr) -> Expr:
        if isinstance(expr, ir.Num):
            if isinstance(expr.value, bool) or not isinstance(expr.value, int):
                return Const(float(expr.value), self.compute)
            return const(expr.value)
        if isinstance(expr, ir.Param):
            arg = self.scalar_of[expr.name]
            return self.to_compute(Var(arg.name, arg.dtype))
        if isinstance(expr, ir.IndexVal):
            return binop("+", self.index_var(expr.name), self.size(expr.offset))
        if isinstance(expr, ir.Access):
            return self.access(expr)
        if isinstance(expr, ir.Unary):
            arg = self.translate(expr.arg)
            if arg.dtype == BOOL:
                arg = self.to_compute(arg)
            if isinstance(arg, Const):
                return Const(-arg.value, arg.dtype)
            return UnOp("neg", arg, arg.dtype)
        if isinstance(expr, ir.Binary):
            return self.binary(expr)
        assert isinstance(expr, ir.Call)
        return self.call(expr.fn, [self.translate(a) for a in expr.args])

    def binary(self, expr: ir.Binary) -> Expr:
        lhs, rhs = self.translate(expr.lhs), self.translate(expr.rhs)
        if expr.op in ir.COMPARISONS:
            lhs, rhs = self.unify(lhs, rhs)
            return binop(expr.op, lhs, rhs)
        if expr.op == "^":
            if isinstance(rhs, Const) and rhs.dtype == INDEX:
                return BinOp("^", self.to_compute(lhs), rhs, self.compute)
            return BinOp("^", self.to_compute(lhs), self.to_compute(rhs), self.compute)
        if expr.op == "/":
            return BinOp("/", self.to_compute(lhs), self.to_compute(rhs), self.compute)
        lhs, rhs = self.unify(lhs, rhs)
        return binop(expr.op, lhs, rhs)

    def call(self, fn: str, args: list[Expr]) -> Expr:
        if fn == "ifelse":
            cond, then, other = args
            then, other = self.unify(then, other)
            return Select(self.as_bool(cond), then, other, then.dtype)
        if fn in ("max", "min"):
            a, b = self.unify(*args)
            return binop(fn, a, b)
        (x,) = args
        if fn in ("conj", "real"):
            return x if x.dtype != BOOL else self.to_compute(x)
        if fn == "imag":
            return Const(0.0, self.compute)
        if fn == "abs" and x.dtype == INDEX:
            return Call("abs", (x,), INDEX)
        x = self.to_compute(x)
        zero, one = Const(0.0, self.compute), Const(1.0, self.compute)
        if fn == "relu":
            return Select(binop(">", x, zero), x, zero, self.compute)
        if fn == "sigmoid":  # 1/(1+exp(-x)); exp(-|x|) never overflows
            e = Call("exp", (UnOp("neg", Call("abs", (x,), self.compute), self.compute),), self.compute)
            pos = BinOp("/", one, BinOp("+", one, e, self.compute), self.compute)
            neg = BinOp("/", e, BinOp("+", one, e, self.compute), self.compute)
            return Select(binop(">=", x, zero), pos, neg, self.compute)
        if fn == "softplus":  # log(1+exp(x)) = max(x,0) + log1p(exp(-|x|))
            e = Call("exp", (UnOp("neg", Call("abs", (x,), self.compute), self.compute),), self.compute)
            return BinOp("+", binop("max", x, zero), Call("log1p", (e,), self.compute), self.compute)
        if fn not in MATH_FUNCTIONS:
            raise TullaxError(f"function {fn} is not supported by the loop backends")
        return Call(fn, (x,), self.compute)

    def access(self, acc: ir.Access) -> Expr:
        """A read: position per axis, with pad and indirect checks folded into a lazy Select."""
        arg = self.array_of[acc.array]
        pad_checks: list[Expr] = []
        ind_checks: list[Expr] = []
        index: list[Expr] = []
        for axis, idx in enumerate(acc.idx):
            pos, checks, pad = self.position(idx, acc.array, axis)
            (pad_checks if pad else ind_checks).extend(checks)
            index.append(pos)
        value: Expr = self.to_compute(Load(arg.name, tuple(index), arg.dtype))
        if ind_checks:  # an index array pointing outside the axis: the gather reads NaN
            value = Select(conjunction(ind_checks), value, Const(NAN, self.compute), self.compute)
        if pad_checks:
            value = Select(conjunction(pad_checks), value, Const(0.0, self.compute), self.compute)
        return value

    def position(self, idx, array: str, axis: int) -> tuple[Expr, list[Expr], bool]:
        """(position on ``array``'s ``axis``, conditions for it to be inside, whether they are pad conditions).
        The extent becomes a size parameter only where a check or a wrap needs it."""
        if isinstance(idx, Affine):
            pos = self.linear(idx.terms, idx.const)
            if idx.div != 1:  # only under a guard that checked divisibility: exact
                pos = binop("//", pos, const(idx.div))
            return pos, [], False
        if isinstance(idx, Wrapped):
            inner = self.linear(idx.inner.terms, idx.inner.const)
            extent = self.extent(array, axis)
            if idx.kind == "mod":
                return binop("mod", inner, extent), [], False
            if idx.kind == "clamp":
                return binop("min", binop("max", inner, const(0)), binop("-", extent, const(1))), [], False
            checks = []
            if idx.inner.div != 1:
                checks.append(binop("==", binop("mod", inner, const(idx.inner.div)), const(0)))
                inner = binop("//", inner, const(idx.inner.div))
            checks += [binop(">=", inner, const(0)), binop("<", inner, extent)]
            return inner, checks, True
        assert isinstance(idx, Indirect)
        temp = self.indirect_temp(idx)
        extent = self.extent(array, axis)
        return temp, [binop(">=", temp, const(0)), binop("<", temp, extent)], False

    def indirect_temp(self, idx: Indirect) -> Var:
        """``ix[e]`` read once into a temporary at the level where e is known (ix[e] itself is in range)."""
        key = ("indirect", idx.array, idx.inner.terms, idx.inner.const)
        if key in self.state.temps:
            return Var(self.state.temps[key], INDEX)
        arg = self.array_of[idx.array]
        pos = self.linear(idx.inner.terms, idx.inner.const)
        value = cast(Load(arg.name, (pos,), arg.dtype), INDEX)
        name = self.fresh()
        level = self.expr_level(value)
        self.state.temps[key] = name
        self.state.levels[name] = level
        self.add_item(_Item(level, 2, stmt=Let(name, value)))
        return Var(name, INDEX)

    # -- hoisting --------------------------------------------------------------------------------
    def hoist(self, expr: Expr, inner: int) -> Expr:
        """Bind sub-expressions with loads or calls that are known above level ``inner`` to temporaries
        there. Never out of a Select branch (it may be valid only when the condition holds)."""
        level = self.expr_level(expr)
        if level < inner and not isinstance(expr, (Const, Var)) and _costly(expr):
            expr = self._hoist_children(expr, level)  # parts known even further out go further out
            if expr in self.state.temps:
                return Var(self.state.temps[expr], expr.dtype)
            name = self.fresh()
            self.state.temps[expr] = name
            self.state.levels[name] = level
            self.add_item(_Item(level, 4, stmt=Let(name, expr)))
            return Var(name, expr.dtype)
        return self._hoist_children(expr, inner)

    def _reuse(self, expr: Expr) -> Expr:
        """Replace sub-expressions that a hoisted temporary already holds (its Let dominates every deeper
        statement: guards at its level come before it and wrap everything after)."""
        if expr in self.state.temps and not isinstance(expr, (Const, Var)):
            return Var(self.state.temps[expr], expr.dtype)
        if isinstance(expr, Select):
            return replace(expr, cond=self._reuse(expr.cond), then=self._reuse(expr.then),
                           orelse=self._reuse(expr.orelse))
        if isinstance(expr, BinOp):
            return replace(expr, lhs=self._reuse(expr.lhs), rhs=self._reuse(expr.rhs))
        if isinstance(expr, (UnOp, Cast)):
            return replace(expr, arg=self._reuse(expr.arg))
        if isinstance(expr, Call):
            return replace(expr, args=tuple(self._reuse(a) for a in expr.args))
        return expr

    def _hoist_children(self, expr: Expr, inner: int) -> Expr:
        if isinstance(expr, Select):  # branches: only reuse values already computed unconditionally
            return replace(expr, cond=self.hoist(expr.cond, inner), then=self._reuse(expr.then),
                           orelse=self._reuse(expr.orelse))
        if isinstance(expr, Load):
            return expr  # its index arithmetic is cheap
        if isinstance(expr, BinOp):
            return replace(expr, lhs=self.hoist(expr.lhs, inner), rhs=self.hoist(expr.rhs, inner))
        if isinstance(expr, (UnOp, Cast)):
            return replace(expr, arg=self.hoist(expr.arg, inner))
        if isinstance(expr, Call):
            return replace(expr, args=tuple(self.hoist(a, inner) for a in expr.args))
        return expr

    # -- assembly --------------------------------------------------------------------------------
    def _loop_bounds(self, name: str, bounds: dict[str, list[tuple[str, Expr]]]) -> tuple[Expr, Expr]:
        if name == TILE:
            rng = self.ranges[self.tile]
            size = self.tile_elems
            count = binop("//", binop("+", self.size(rng.hi - rng.lo), const(size - 1)), const(size))
            return const(0), count
        if name == self.tile:
            start, stop = Var("tile_lo", INDEX), Var("tile_hi", INDEX)
        else:
            rng = self.ranges[name]
            start, stop = self.size(rng.lo), self.size(rng.hi)
        for kind, value in bounds.get(name, []):
            if kind == "start":
                start = binop("max", start, value)
            else:
                stop = binop("min", stop, value)
        return start, stop

    def nest(self, level: int, innermost: list[Stmt], bounds) -> list[Stmt]:
        """The statements inside loop ``level`` (the per-element block when level is the last parallel one):
        the items placed there, then the next loop, innermost statements at the bottom."""
        order = self.loops()
        if level + 1 < len(order):
            name = order[level + 1]
            start, stop = self._loop_bounds(name, bounds)
            parallel = name in self.parallel
            inner = [Loop(self.var_of[name], start, stop, parallel,
                          tuple(self.nest(level + 1, innermost, bounds)))]
        else:
            inner = list(innermost)
        items = sorted((i for i in self.state.items if i.level == level), key=lambda i: (i.rank, i.seq))
        return _wrap(items, inner)

    def _parallel_wrap(self, block: list[Stmt]) -> list[Stmt]:
        for name in reversed(self.parallel):
            start, stop = self._loop_bounds(name, {})
            block = [Loop(self.var_of[name], start, stop, True, tuple(block))]
        return block

    def _reduction_body(self, body: ir.Expr, bounds) -> list[Stmt]:
        if self.tile:
            return self._tiled_body(body, bounds)
        spec = self.spec
        top = len(self.parallel) - 1
        innermost = len(self.loops()) - 1
        value = self.hoist(self.to_compute(self.translate(body)), innermost)
        out_index = tuple(self.index_var(n) for n in spec.free)
        mode = "add" if spec.assign == "+=" else "set"
        has_loops = innermost > top
        has_guards = any(i.guard is not None for i in self.state.items)
        block: list[Stmt]
        if not has_loops and not has_guards and spec.redop != "logsumexp":
            block = self.nest(top, [], bounds)
            result: Expr = value
        elif spec.redop == "logsumexp":
            block, result = self._logsumexp(value, bounds)
        else:
            acc = "acc"
            block = [Let(acc, Const(INITIAL[spec.redop], self.compute))]
            block += self.nest(top, [Accum(acc, spec.redop, value)], bounds)
            result = Var(acc, self.compute)
        if spec.finalizer:
            result = self.call(spec.finalizer, [result])
        block.append(Store(self.out.name, out_index, result, mode))
        if not self.parallel and block and has_loops:
            block = [_mark_reduce_parallel(s) for s in block]
        return self._parallel_wrap(block)

    def _tile_bounds(self) -> list[Stmt]:
        """``tile_lo``/``tile_hi``: the range of j in this tile (Lets at the top of the per-element block)."""
        self.state.levels.update(tile_lo=len(self.parallel) - 1, tile_hi=len(self.parallel) - 1)
        rng = self.ranges[self.tile]
        tile_lo = binop("+", self.size(rng.lo), binop("*", Var("tile", INDEX), const(self.tile_elems)))
        return [
            Let("tile_lo", tile_lo),
            Let("tile_hi", binop("min", binop("+", Var("tile_lo", INDEX), const(self.tile_elems)),
                                 self.size(rng.hi))),
        ]

    def _tiled_body(self, body: ir.Expr, bounds) -> list[Stmt]:
        """Tiles of j in parallel; inside, the output elements of the tile are the accumulators."""
        spec = self.spec
        top = len(self.parallel) - 1
        block = self._tile_bounds()
        value = self.hoist(self.to_compute(self.translate(body)), len(self.loops()) - 1)
        out_index = tuple(self.index_var(n) for n in spec.free)
        here = Load(self.out.name, out_index, self.compute)
        jvar = self.var_of[self.tile]

        def over_tile(stmt: Stmt) -> Stmt:
            return Loop(jvar, Var("tile_lo", INDEX), Var("tile_hi", INDEX), False, (stmt,))

        if spec.assign != "+=":
            block.append(over_tile(Store(self.out.name, out_index, Const(INITIAL[spec.redop], self.compute))))
        if spec.redop == "+":
            update = Store(self.out.name, out_index, value, "add")
        else:
            op = {"*": "*", "max": "max", "min": "min"}[spec.redop]
            update = Store(self.out.name, out_index, binop(op, here, value), "set")
        block += self.nest(top, [update], bounds)
        if spec.finalizer:
            block.append(over_tile(Store(self.out.name, out_index, self.call(spec.finalizer, [here]))))
        return self._parallel_wrap(block)

    def _logsumexp(self, value: Expr, bounds) -> tuple[list[Stmt], Expr]:
        """Two passes over the same loops: m = max(v); s = sum(exp(v - m')) with m' = m, or 0 when m is
        infinite; result m' + log(s)."""
        top = len(self.parallel) - 1
        c = self.compute
        block: list[Stmt] = [Let("accm", Const(-math.inf, c))]
        block += self.nest(top, [Accum("accm", "max", value)], bounds)
        m = Var("accm", c)
        finite = binop("and", binop(">", m, Const(-math.inf, c)), binop("<", m, Const(math.inf, c)))
        block.append(Let("shift", Select(finite, m, Const(0.0, c), c)))
        shift = Var("shift", c)
        block.append(Let("accs", Const(0.0, c)))
        term = Call("exp", (BinOp("-", value, shift, c),), c)
        block += self.nest(top, [Accum("accs", "+", term)], bounds)
        return block, BinOp("+", shift, Call("log", (Var("accs", c),), c), c)

    def _scatter_body(self, body: ir.Expr, bounds) -> list[Stmt]:
        spec = self.spec
        innermost = len(self.loops()) - 1
        block = self._tile_bounds() if self.tile else []
        checks: list[Expr] = []
        index: list[Expr] = []
        for axis, idx in enumerate(spec.lhs):
            if isinstance(idx, Wrapped) and idx.kind == "pad":  # its conditions are guards already
                pos = self.linear(idx.inner.terms, idx.inner.const)
                if idx.inner.div != 1:
                    pos = binop("//", pos, const(idx.inner.div))
            else:
                pos, found, _ = self.position(idx, spec.out, axis)
                checks += found  # an index array pointing outside: the element is skipped
            index.append(pos)
        if checks:
            check = conjunction(checks)
            self.add_item(_Item(self.expr_level(check), 3, guard=check))
        value = self.hoist(self.to_compute(self.translate(body)), innermost)
        colliding = any(n not in self.solved for n in self.serial)  # the tile loop over j never collides
        store = Store(self.out.name, tuple(index), value, "atomic_add" if colliding else "add")
        block += self.nest(len(self.parallel) - 1, [store], bounds)
        return self._parallel_wrap(block)


def _dependency_order(solutions: list[tuple[str, Cond, int]]) -> list[tuple[str, Cond, int]]:
    """Solutions ordered so each one only uses loop indices or indices solved before it."""
    targets = {t for t, _, _ in solutions}
    done: set[str] = set()
    ordered: list[tuple[str, Cond, int]] = []
    pending = list(solutions)
    while pending:
        ready = [s for s in pending if all(n in done or n not in targets for n in s[1].names() if n != s[0])]
        if not ready:
            raise TullaxError("internal error: cyclic index solutions")
        for item in ready:
            ordered.append(item)
            done.add(item[0])
            pending.remove(item)
    return ordered


def _stmt_vars(stmts) -> set[str]:
    """Every variable name an expression of ``stmts`` reads."""
    found: set[str] = set()
    for stmt in walk_stmts(tuple(stmts)):
        if isinstance(stmt, Loop):
            exprs = [stmt.start, stmt.stop]
        elif isinstance(stmt, If):
            exprs = [stmt.cond]
        elif isinstance(stmt, Store):
            exprs = [stmt.value, *stmt.index]
        else:
            exprs = [stmt.value]
        for expr in exprs:
            found |= expr_vars(expr)
    return found


def _costly(expr: Expr) -> bool:
    return any(isinstance(n, (Load, Call)) for n in walk_expr(expr))


def _wrap(items: list[_Item], inner: list[Stmt]) -> list[Stmt]:
    """Lets in order; a guard wraps everything after it (consecutive guards merge into one If)."""
    out: list[Stmt] = []
    for k, item in enumerate(items):
        if item.guard is not None:
            guards = [item.guard]
            rest = items[k + 1:]
            while rest and rest[0].guard is not None:
                guards.append(rest[0].guard)
                rest = rest[1:]
            out.append(If(conjunction(guards), tuple(_wrap(rest, inner))))
            return out
        out.append(item.stmt)
    return out + inner


def _mark_reduce_parallel(stmt: Stmt) -> Stmt:
    """The outermost reduction loop of a kernel without parallel loops (possibly inside top-level guards)."""
    if isinstance(stmt, Loop):
        return replace(stmt, reduce_parallel=True)
    if isinstance(stmt, If):
        return replace(stmt, then=tuple(_mark_reduce_parallel(s) for s in stmt.then))
    return stmt


def _substitute(cond: Cond, target: str, eq: Cond) -> Cond:
    """Replace ``target`` in ``cond`` using ``eq`` (coef ±1 on target): target = -(eq - coef*target)/coef."""
    k = cond.coef(target)
    if k == 0:
        return cond
    c = eq.coef(target)  # ±1
    factor = -k * c  # cond + factor*eq removes target: k + factor*c = k - k*c*c = 0
    terms = dict(cond.terms)
    for name, coef in eq.terms:
        terms[name] = terms.get(name, 0) + factor * coef
    const_part = cond.const + eq.const * factor
    return Cond(_lin(terms, const_part), const_part, cond.rel, cond.div)


def _replace_nodes(expr: ir.Expr, mapping: dict[int, ir.Expr]) -> ir.Expr:
    """Rebuild ``expr`` with the nodes whose id is in ``mapping`` replaced (top-down, identity-based)."""
    if id(expr) in mapping:
        return mapping[id(expr)]
    if isinstance(expr, ir.Unary):
        return replace(expr, arg=_replace_nodes(expr.arg, mapping))
    if isinstance(expr, ir.Binary):
        return replace(expr, lhs=_replace_nodes(expr.lhs, mapping), rhs=_replace_nodes(expr.rhs, mapping))
    if isinstance(expr, ir.Call):
        return replace(expr, args=tuple(_replace_nodes(a, mapping) for a in expr.args))
    return expr


__all__ = ["lower", "loop_order", "tile_size"]
