"""benchmarks/ieee_flags.py's assembly check (issue 44): where the C that ships compiles to the same assembly under
the old fast-math flags as under ours, the IEEE flags cost that kernel nothing. The row max's NaN-propagating lanes
(``CPrinter.lanes``: a max per lane and an OR of the lanes' NaN masks) are such a kernel; a product by zero, which
GCC folds to 0 under -fno-signed-zeros, is not."""
from __future__ import annotations

import pytest
from loop_backends import c_unavailable

from tullax.backends.base import Signature
from tullax.spec.frontend import compile_spec

pytestmark = pytest.mark.skipif(bool(c_unavailable()), reason=f"c backend: {c_unavailable()}")


@pytest.mark.parametrize("spec, same", [("(max) m[i] := x[i,j]", True), ("y[i] := x[i]*0", False)])
def test_the_ieee_flags_change_no_instruction_of_the_row_max_lanes_and_do_change_a_product_by_zero(spec, same):
    from benchmarks.ieee_flags import same_code

    assert same_code(compile_spec(spec)[1], Signature(("float32",), "float32")) is same
