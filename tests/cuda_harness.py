"""Runs printed CUDA kernels on the CPU: ONE g++ build of many kernels (tests/cuda_host.h plus a generated
``main`` that reads launches from a file), one process that runs them all, results read back.

A launch's arguments follow ``tullax.printers.cuda.parameters``: NumPy arrays for array parameters, a NumPy
scalar (or 0-d array) for scalar parameters, Python ints for sizes and extents. The kernel writes its first
parameter (the output), which comes back. The build uses ``-fsanitize=thread`` where the thread sanitizer
works on this machine: then any race between two blocks (a missing atomic) fails the run.
"""
from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tullax.compiler.loops import LoopKernel
from tullax.compiler.split import SplitPolicy
from tullax.printers.cuda import INDEX_TYPES, parameters, print_module

HEADER = Path(__file__).parent / "cuda_host.h"
GPP = shutil.which("g++")
WORKERS = 3  # OS threads per launch: more than the 2 cores, so blocks interleave
GEOMETRIES = ((3, 4), (2, 1), (5, 3), (1, 8), (4, 2))  # (blocks, threads per block), cycled over launches
# Cooperative kernels need whole warps; 1, 2 and 3 warps run the cross-warp combine with idle slots
COOPERATIVE_GEOMETRIES = ((3, 64), (2, 32), (2, 96))
TILED_GRIDS = (3, 2, 1)  # blocks of a block-tiled kernel (its grid-stride loop covers every tile)
_INT = struct.Struct("<q")
# Every plain sum split, however short (the corpus's sizes are small), into up to 3 pieces per output element:
# most cut a loop into chunks (a power of two long), so ragged last chunks run too
SPLIT_EVERYTHING = SplitPolicy(threads=1 << 12, below=1 << 30, min_work=2, min_terms=1, max_pieces=3)


class RaceError(AssertionError):
    """The thread sanitizer found a data race."""


@dataclass(frozen=True)
class Launch:
    kernel: LoopKernel
    index_bits: int
    arguments: tuple[Any, ...]


# what every main that runs printed kernels begins with: the launch file's reader, the two files, the launch count
MAIN_PRELUDE = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>

static long long tx_read_int(FILE* in) {
    long long value = 0;
    if (std::fread(&value, sizeof value, 1, in) != 1) std::exit(3);
    return value;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 2;
    long long launches = tx_read_int(in);
"""
_MAIN = MAIN_PRELUDE + r"""    for (long long n = 0; n < launches; ++n) {
        long long kernel = tx_read_int(in);
        tx_geometry geometry;
        geometry.grid = unsigned(tx_read_int(in));
        geometry.block = unsigned(tx_read_int(in));
        geometry.workers = unsigned(tx_read_int(in));
        geometry.seed = unsigned(tx_read_int(in));
        long long count = tx_read_int(in);
        std::vector<std::vector<long double>> storage(count);  // long double: aligned for every element type
        std::vector<void*> p(count);
        std::vector<long long> sizes(count);
        for (long long k = 0; k < count; ++k) {
            sizes[k] = tx_read_int(in);
            storage[k].resize(sizes[k] / sizeof(long double) + 1);
            if (sizes[k] && std::fread(storage[k].data(), 1, sizes[k], in) != size_t(sizes[k])) return 3;
            p[k] = storage[k].data();
        }
        switch (kernel) {
%(cases)s
            default: return 4;
        }
        std::fwrite(&sizes[0], sizeof(long long), 1, out);
        std::fwrite(p[0], 1, sizes[0], out);
    }
    std::fclose(out);
    return 0;
}
"""


def _case(number: int, launch: Launch) -> str:
    args = []
    for k, param in enumerate(parameters(launch.kernel, launch.index_bits)):
        args.append(f"({param.ctype})p[{k}]" if param.pointer else f"*({param.ctype}*)p[{k}]")
    call = f"[](void** p) {{ {launch.kernel.name}({', '.join(args)}); }}"
    launcher = "tx_launch_blocks" if launch.kernel.cooperative or launch.kernel.tile else "tx_launch"
    return f"            case {number}: {launcher}(geometry, {call}, p.data()); break;"


@functools.lru_cache(maxsize=None)
def sanitizer_works() -> bool:
    """Whether g++'s thread sanitizer builds and runs here (it needs a compatible kernel memory layout)."""
    if GPP is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cpp", Path(tmp) / "probe"
        src.write_text("#include <thread>\nint main() { std::thread t([] {}); t.join(); return 0; }\n")
        built = subprocess.run([GPP, "-fsanitize=thread", str(src), "-o", str(exe)], capture_output=True)
        return built.returncode == 0 and subprocess.run([str(exe)], capture_output=True).returncode == 0


def build(kernels: Sequence[tuple[LoopKernel, int]], directory: Path,
          edit: Callable[[str], str] | None = None, sanitize: bool = True) -> Path:
    """Compile ``kernels`` (unique names) into one executable; launches refer to them by position. ``edit``:
    a change to the printed source first (tests that break a kernel on purpose). ``sanitize=False``: without
    the thread sanitizer (many launches of cooperating threads run several times faster)."""
    source = print_module(kernels)
    if edit is not None:
        source = edit(source)
    launches = [Launch(kernel, bits, ()) for kernel, bits in kernels]
    cases = "\n".join(_case(n, launch) for n, launch in enumerate(launches))
    path = directory / "kernels.cpp"
    path.write_text(f'#include "{HEADER}"\n{source}\n{_MAIN % {"cases": cases}}')
    exe = directory / "kernels"
    flags = ["-std=c++20", "-O1", "-g0", "-pthread", "-Wall", "-Werror", "-Wno-unused-variable"]
    if sanitize and sanitizer_works():
        flags.append("-fsanitize=thread")
    done = subprocess.run([GPP, *flags, str(path), "-o", str(exe)], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"g++ could not compile the printed CUDA C ({path}):\n{done.stderr[-20000:]}")
    return exe


def _bytes(param, value) -> bytes:
    if param.pointer:
        return np.ascontiguousarray(np.asarray(value, dtype=param.dtype)).tobytes()
    return np.asarray(value, dtype=np.int32 if INDEX_TYPES[32] in param.ctype else np.int64).tobytes()


def run(exe: Path, jobs: Sequence[tuple[int, Launch]], seed: int = 0) -> list[np.ndarray]:
    """Run every launch (kernel position in the build, its arguments); returns each launch's output."""
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path, results_path = Path(tmp) / "jobs.bin", Path(tmp) / "results.bin"
        with open(jobs_path, "wb") as f:
            f.write(_INT.pack(len(jobs)))
            for n, (number, launch) in enumerate(jobs):
                shapes = COOPERATIVE_GEOMETRIES if launch.kernel.cooperative else GEOMETRIES
                if launch.kernel.tile is not None:  # exactly the threads of its register tiles
                    shapes = tuple((grid, launch.kernel.tile.threads) for grid in TILED_GRIDS)
                grid, block = shapes[n % len(shapes)]
                params = parameters(launch.kernel, launch.index_bits)
                f.write(b"".join(_INT.pack(v) for v in (number, grid, block, WORKERS, seed + n, len(params))))
                for param, value in zip(params, launch.arguments, strict=True):
                    data = _bytes(param, value)
                    f.write(_INT.pack(len(data)) + data)
        env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66 report_signal_unsafe=0"}
        done = subprocess.run([str(exe), str(jobs_path), str(results_path)], capture_output=True, text=True,
                              env=env)
        if done.returncode == 66:
            raise RaceError(done.stderr[-6000:])
        if done.returncode != 0:
            raise AssertionError(f"the kernels failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
        data = results_path.read_bytes()
    outputs, at = [], 0
    for _, launch in jobs:
        (size,) = _INT.unpack_from(data, at)
        out = launch.arguments[0]
        outputs.append(np.frombuffer(data[at + 8:at + 8 + size], dtype=out.dtype).reshape(out.shape).copy())
        at += 8 + size
    return outputs


def assert_race_is_caught(exe: Path, launch: Launch, want: np.ndarray, what: str, tries: int = 4) -> None:
    """A kernel built with a barrier removed is caught: the sanitizer reports a race, or the result of one of
    ``tries`` seeds differs from ``want``."""
    wrong = False
    for attempt in range(tries):
        try:
            got = run(exe, [(0, launch)], seed=attempt)[0]
        except RaceError:
            return
        wrong = wrong or not np.allclose(got, want, rtol=1e-10)
    assert wrong, f"{what} without its barrier went unnoticed"
