"""tullax.spec.affine: every operation of the affine-form algebra against direct evaluation at random integer
points (exact, with Fractions), and the promises about the order of terms and the normal form."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest

from tullax.spec.affine import AffineForm
from tullax.spec.ir import Affine
from tullax.spec.sizes import Sym

NAMES = ("i", "j", "k", "m")
SHAPES = {"x": (7,), "y": (3, 5)}
EXTENTS = (Sym.extent("x", 0), Sym.extent("y", 1))
SEEDS = range(60)


def _sym(rng: random.Random) -> Sym:
    out = Sym(rng.randint(-6, 6))
    for extent in EXTENTS:
        if rng.random() < 0.4:
            out = out + extent * rng.randint(-3, 3)
    return out


def _form(rng: random.Random, max_div: int = 4) -> AffineForm:
    names = rng.sample(NAMES, rng.randint(1, len(NAMES)))
    terms = tuple((n, rng.choice([c for c in range(-5, 6) if c])) for n in names)
    return AffineForm(terms, _sym(rng), rng.randint(1, max_div))


def _point(rng: random.Random) -> dict[str, int]:
    return {n: rng.randint(-10, 10) for n in NAMES}


def _direct(form: AffineForm, point: dict[str, int | Fraction]) -> Fraction:
    """The value written out from the fields, independently of ``AffineForm.eval``."""
    numerator = form.const.eval(SHAPES) + sum(Fraction(point[n]) * c for n, c in form.terms)
    return Fraction(numerator) / form.div


@pytest.mark.parametrize("seed", SEEDS)
def test_arithmetic_agrees_with_evaluation(seed: int) -> None:
    rng = random.Random(seed)
    a, b, p = _form(rng), _form(rng), _point(rng)
    k = rng.randint(-4, 4)
    assert a.eval(p, SHAPES) == _direct(a, p)
    assert (a + b).eval(p, SHAPES) == _direct(a, p) + _direct(b, p)
    assert (a - b).eval(p, SHAPES) == _direct(a, p) - _direct(b, p)
    assert (-a).eval(p, SHAPES) == -_direct(a, p)
    assert a.scale(k).eval(p, SHAPES) == k * _direct(a, p)
    assert (a - a).terms == () and (a - a).eval(p, SHAPES) == 0
    assert AffineForm.index("j").eval(p, SHAPES) == p["j"]
    assert AffineForm.constant(Sym.extent("x", 0)).eval(p, SHAPES) == SHAPES["x"][0]


@pytest.mark.parametrize("seed", SEEDS)
def test_normal_form_keeps_the_value_and_is_unique(seed: int) -> None:
    rng = random.Random(seed)
    a, p = _form(rng), _point(rng)
    normal = a.normalized()
    assert normal.eval(p, SHAPES) == _direct(a, p)
    assert normal.normalized() == normal
    assert normal.div >= 1
    coefs = [c for _, c in normal.terms]
    assert [c < 0 for c in coefs] == sorted(c < 0 for c in coefs)  # positive terms first
    k = rng.randint(2, 5) * rng.choice([1, -1])  # the same value, spelled with a common factor
    spelled = AffineForm.canonical({n: c * k for n, c in a.terms}, a.const * k, a.div * k)
    assert spelled == normal
    assert (a + AffineForm.index("z") - AffineForm.index("z")).normalized() == normal


@pytest.mark.parametrize("seed", SEEDS)
def test_substitution_agrees_with_evaluating_the_solution_first(seed: int) -> None:
    rng = random.Random(seed)
    a, p = _form(rng), _point(rng)
    solved = rng.sample(NAMES, rng.randint(1, 2))
    solutions = {n: _form(rng) for n in solved}
    at = dict(p, **{n: _direct(s, p) for n, s in solutions.items()})  # simultaneous: solutions read p
    assert a.substitute(solutions).eval(p, SHAPES) == _direct(a, at)


@pytest.mark.parametrize("seed", SEEDS)
def test_solving_for_an_index_satisfies_the_equation(seed: int) -> None:
    rng = random.Random(seed)
    a, value, p = _form(rng), _form(rng), _point(rng)
    name = rng.choice(a.names())
    value = AffineForm(tuple(t for t in value.terms if t[0] != name), value.const, value.div)
    solution = a.solve_for(name, value)
    assert name not in solution.names() and solution.div >= 1
    at = dict(p, **{name: solution.eval(p, SHAPES)})
    assert _direct(a, at) == _direct(value, at)


def test_terms_keep_the_order_they_were_written_in() -> None:
    a = AffineForm((("k", 2), ("i", -1)))
    b = AffineForm((("j", 1), ("i", 1), ("k", 1)))
    assert (a + b).terms == (("k", 3), ("j", 1))  # i cancels, j comes after a's terms
    assert a.substitute({"k": AffineForm((("m", 1), ("i", 1)))}).terms == (("i", 1), ("m", 2))
    assert a.normalized().terms == (("k", 2), ("i", -1))
    assert AffineForm.canonical({"k": -2, "i": 4}, Sym(6), 2).terms == (("i", 2), ("k", -1))


def test_conversion_to_and_from_index_expressions() -> None:
    aff = Affine((("i", 2), ("k", -1)), Sym.extent("x", 0) - 1, 3)
    form = AffineForm.of(aff)
    assert form.to_affine() == aff and form.coef("i") == 2 and form.coef("j") == 0
    assert form.coefs() == {"i": 2, "k": -1}
    assert AffineForm.of(Affine.index("i")).plain == "i" and form.plain is None


def test_solving_for_a_missing_or_circular_index_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot solve for 'j'"):
        AffineForm.index("i").solve_for("j", AffineForm())
    with pytest.raises(ValueError, match="cannot solve for 'i'"):
        AffineForm.index("i").solve_for("i", AffineForm.index("i"))
