"""The memory-traffic tracer: one block of a printed CUDA kernel run on the CPU (g++, ``tests/cuda_trace.h``)
through traced input pointers, each load recorded as (thread, its dynamic load number, array, byte offset).

The k-th load of the 32 lanes of a warp is one warp request (lanes execute in lockstep; a lane that has no k-th
load, past a ragged edge, is left out). Per request: the 32-byte sectors and 128-byte lines it touches (what
the L1 serves and what DRAM would move), and whether every lane read one address (a broadcast). Offsets are
from the buffer's start, which cudaMalloc aligns to 256 bytes, so sectors and lines are those of the device.

Only the kernel's INPUT arrays are traced (the global loads of a ``:=`` kernel). Shared-memory reads and
writes are counted apart (``SharedTraffic``: ``Traffic.shared``, ``Traffic.shared_writes``): the k-th shared
access of a warp's lanes is one request, served in as many wavefronts as the most distinct 4-byte words any one
of the 32 banks must deliver (lanes reading one word share it: a broadcast); a request above its ideal (the words
it reads / 32, at least 1) has bank conflicts.
"""
from __future__ import annotations

import math
import struct
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from cuda_harness import GPP, HEADER, MAIN_PRELUDE, Launch, _bytes

from tullax.compiler.loops import LoopKernel
from tullax.printers.clike import storage_type
from tullax.printers.cuda import parameters, print_module

TRACE_HEADER = Path(__file__).parent / "cuda_trace.h"
WARP = 32
SECTOR = 32
LINE = 128
_INT = struct.Struct("<q")


@dataclass(frozen=True)
class ArrayTraffic:
    """The warp requests of one input array over the traced warps."""

    array: str  # the kernel's array parameter (a1...)
    source: str  # the spec input it holds
    requests: int
    sectors: float  # mean 32-byte sectors per request
    lines: float  # mean 128-byte lines per request
    max_sectors: int
    broadcasts: int  # requests whose lanes all read one address

    @property
    def coalesced(self) -> bool:
        """At most 4 sectors (one line of 4-byte elements) per request, or every request a broadcast."""
        return self.max_sectors <= 4 or self.broadcasts == self.requests


BANKS = 32  # shared memory: 32 banks of 4-byte words


@dataclass(frozen=True)
class SharedTraffic:
    """The warp requests of the traced warps' shared-memory reads."""

    requests: int = 0
    wavefronts: int = 0  # the banks' passes over every request
    ideal: int = 0  # the passes they would take without conflicts
    max_ways: int = 0  # the most passes one request takes

    @property
    def conflicts(self) -> int:
        """Passes beyond the ideal: 0 for a conflict-free kernel."""
        return self.wavefronts - self.ideal


def bank_passes(accesses: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(wavefronts, ideal) of one warp request: ``accesses`` are the lanes' (element size, byte offset)."""
    words = {offset // 4 + n for size, offset in accesses for n in range(max(size // 4, 1))}
    per_bank: dict[int, int] = defaultdict(int)
    for word in words:
        per_bank[word % BANKS] += 1
    return max(per_bank.values()), max(math.ceil(len(words) / BANKS), 1)


@dataclass(frozen=True)
class Traffic:
    kernel: str
    grid: int
    block: int
    threads: int  # GPU threads traced
    arrays: tuple[ArrayTraffic, ...]
    loads: int  # global loads of the traced threads
    outputs: int = 0  # output elements the traced block wrote (a ':=' kernel's output starts as NaN)
    shared: SharedTraffic = SharedTraffic()
    shared_writes: SharedTraffic = SharedTraffic()  # the same count over the shared-memory writes

    @property
    def sectors(self) -> float:
        """32-byte sectors of every counted warp request together."""
        return sum(a.sectors * a.requests for a in self.arrays)

    @property
    def requests(self) -> int:
        return sum(a.requests for a in self.arrays)

    def array(self, source: str) -> ArrayTraffic:
        return next(a for a in self.arrays if a.source == source)

    def summary(self) -> str:
        parts = [f"{a.source}: {a.sectors:.1f} sectors / {a.lines:.1f} lines per request ({a.requests} requests"
                 + (f", {a.broadcasts} broadcast" if a.broadcasts else "") + ")" for a in self.arrays]
        return f"{self.kernel} grid {self.grid} x {self.block}: " + "; ".join(parts)


_MAIN = MAIN_PRELUDE + r"""    for (long long n = 0; n < launches; ++n) {
        long long kernel = tx_read_int(in);
        tx_geometry geometry;
        geometry.grid = unsigned(tx_read_int(in));
        geometry.block = unsigned(tx_read_int(in));
        geometry.workers = 1;
        geometry.seed = 0;
        unsigned block = unsigned(tx_read_int(in));
        long long count = tx_read_int(in);
        std::vector<std::vector<long double>> storage(count);
        std::vector<void*> p(count);
        for (long long k = 0; k < count; ++k) {
            long long size = tx_read_int(in);
            storage[k].resize(size / sizeof(long double) + 1);
            if (size && std::fread(storage[k].data(), 1, size, in) != size_t(size)) return 3;
            p[k] = storage[k].data();
        }
        std::vector<std::vector<tx_trace_record>> lists;
        switch (kernel) {
%(cases)s
            default: return 4;
        }
        long long threads = (long long)lists.size();
        std::fwrite(&threads, sizeof threads, 1, out);
        for (auto& list : lists) {
            long long size = (long long)list.size();
            std::fwrite(&size, sizeof size, 1, out);
            std::fwrite(list.data(), sizeof(tx_trace_record), list.size(), out);
        }
        long long output = tx_read_int(in);  // the output's size: it comes back, to count what the block wrote
        std::fwrite(&output, sizeof output, 1, out);
        std::fwrite(p[0], 1, output, out);
    }
    std::fclose(out);
    return 0;
}
"""


def _traced_source(kernel: LoopKernel, index_bits: int) -> str:
    """The kernel's printed text with each input pointer parameter declared as a ``tx_traced<T>``."""
    source = print_module([(kernel, index_bits)])[len(print_module([])):]  # without the prelude
    for param in parameters(kernel, index_bits):
        if param.pointer and param.ctype.startswith("const ") and param.kind == "array":
            source = source.replace(param.declaration, f"tx_traced<{storage_type(param.dtype)}> {param.name}", 1)
    return source


def _case(number: int, launch: Launch) -> str:
    args = []
    for k, param in enumerate(parameters(launch.kernel, launch.index_bits)):
        if param.pointer and param.ctype.startswith("const ") and param.kind == "array":
            args.append(f"tx_traced<{storage_type(param.dtype)}>{{({param.ctype})p[{k}], {k}}}")
        elif param.pointer:
            args.append(f"({param.ctype})p[{k}]")
        else:
            args.append(f"*({param.ctype}*)p[{k}]")
    call = f"[](void** p) {{ {launch.kernel.name}({', '.join(args)}); }}"
    return f"            case {number}: lists = tx_trace_block(geometry, block, {call}, p.data()); break;"


def trace(jobs: Sequence[tuple[Launch, int, int]], block_index: int = 0, warps: int | None = 1) -> list[Traffic]:
    """Trace block ``block_index`` of each launch (with its (grid, block) geometry); the first ``warps`` warps'
    requests are counted (None: every warp of the block)."""
    assert GPP is not None
    jobs = [(replace(launch, kernel=replace(launch.kernel, name=f"tx_traced{n}")), grid, block)
            for n, (launch, grid, block) in enumerate(jobs)]  # unique names in one translation unit
    prelude = print_module([]).rstrip()
    sources = [_traced_source(launch.kernel, launch.index_bits) for launch, _, _ in jobs]
    cases = "\n".join(_case(n, launch) for n, (launch, _, _) in enumerate(jobs))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        path = directory / "trace.cpp"
        path.write_text(f'#include "{HEADER}"\n#include "{TRACE_HEADER}"\n{prelude}\n' + "\n".join(sources)
                        + _MAIN % {"cases": cases})
        exe = directory / "trace"
        flags = ["-std=c++20", "-O1", "-g0", "-pthread", "-Wall", "-Werror", "-Wno-unused-variable"]
        done = subprocess.run([GPP, *flags, str(path), "-o", str(exe)], capture_output=True, text=True)
        if done.returncode != 0:
            raise AssertionError(f"g++ could not compile the traced CUDA C ({path}):\n{done.stderr[-20000:]}")
        jobs_path, out_path = directory / "jobs.bin", directory / "trace.bin"
        with open(jobs_path, "wb") as f:
            f.write(_INT.pack(len(jobs)))
            for n, (launch, grid, block) in enumerate(jobs):
                params = parameters(launch.kernel, launch.index_bits)
                f.write(b"".join(_INT.pack(v) for v in (n, grid, block, block_index, len(params))))
                for param, value in zip(params, launch.arguments, strict=True):
                    data = _bytes(param, value)
                    f.write(_INT.pack(len(data)) + data)
                f.write(_INT.pack(np.asarray(launch.arguments[0]).nbytes))
        ran = subprocess.run([str(exe), str(jobs_path), str(out_path)], capture_output=True, text=True)
        if ran.returncode != 0:
            raise AssertionError(f"the traced kernels failed (exit {ran.returncode}):\n{ran.stderr[-6000:]}")
        data = out_path.read_bytes()
    results, at = [], 0
    for launch, grid, block in jobs:
        (threads,) = _INT.unpack_from(data, at)
        threads //= 3  # global loads, then shared reads, then shared writes, per thread
        at += 8
        lists = []
        for _ in range(3 * threads):
            (size,) = _INT.unpack_from(data, at)
            at += 8
            lists.append(np.frombuffer(data, dtype=np.int64, count=2 * size, offset=at).reshape(size, 2))
            at += 16 * size
        (size,) = _INT.unpack_from(data, at)
        before = np.asarray(launch.arguments[0])
        after = np.frombuffer(data, dtype=before.dtype, count=before.size, offset=at + 8)
        at += 8 + size
        # elements the block wrote: the output starts as NaN (a ':=' kernel writes every element once) or, for a
        # kernel that adds into it (split sums), at zero: elements it changed
        old = before.ravel()
        written = int(np.count_nonzero(np.where(np.isnan(old), ~np.isnan(after), old != after)))
        counted = _count(launch, grid, block, lists[:threads], warps)
        results.append(replace(counted, outputs=written, shared=_count_shared(lists[threads:2 * threads], warps),
                               shared_writes=_count_shared(lists[2 * threads:], warps)))
    return results


def _count(launch: Launch, grid: int, block: int, lists: list[np.ndarray], warps: int | None) -> Traffic:
    params = parameters(launch.kernel, launch.index_bits)
    sources = {a.name: a.source for a in launch.kernel.arrays}
    count = math.ceil(len(lists) / WARP) if warps is None else min(warps, math.ceil(len(lists) / WARP))
    stats: dict[int, list[tuple[int, int, bool]]] = defaultdict(list)
    for w in range(count):
        lanes = lists[w * WARP:(w + 1) * WARP]
        for k in range(max((len(lane) for lane in lanes), default=0)):
            present = [lane[k] for lane in lanes if len(lane) > k]
            by_array: dict[int, list[int]] = defaultdict(list)
            for array, offset in present:
                by_array[int(array)].append(int(offset))
            for array, offsets in by_array.items():
                stats[array].append((len({o // SECTOR for o in offsets}), len({o // LINE for o in offsets}),
                                     len(set(offsets)) == 1 and len(offsets) > 1))
    arrays = []
    for position in sorted(stats):
        rows = stats[position]
        name = params[position].name
        arrays.append(ArrayTraffic(name, sources[name], len(rows), sum(r[0] for r in rows) / len(rows),
                                   sum(r[1] for r in rows) / len(rows), max(r[0] for r in rows),
                                   sum(r[2] for r in rows)))
    threads = min(len(lists), count * WARP)
    return Traffic(launch.kernel.name, grid, block, threads, tuple(arrays),
                   sum(len(lane) for lane in lists[:threads]))


def _count_shared(lists: list[np.ndarray], warps: int | None) -> SharedTraffic:
    count = math.ceil(len(lists) / WARP) if warps is None else min(warps, math.ceil(len(lists) / WARP))
    requests = wavefronts = ideal = worst = 0
    for w in range(count):
        lanes = lists[w * WARP:(w + 1) * WARP]
        if lanes and len({len(lane) for lane in lanes}) == 1 and all((lane[:, 0] == 4).all() for lane in lanes):
            # every lane the same 4-byte reads: all requests at once
            words = np.sort(np.stack([lane[:, 1] // 4 for lane in lanes], axis=1), axis=1)  # (requests, lanes)
            fresh = np.ones(words.shape, dtype=bool)
            fresh[:, 1:] = words[:, 1:] != words[:, :-1]
            per_bank = np.zeros((words.shape[0], BANKS), dtype=np.int64)
            rows = np.broadcast_to(np.arange(words.shape[0])[:, None], words.shape)
            np.add.at(per_bank, (rows[fresh], words[fresh] % BANKS), 1)
            passes = per_bank.max(axis=1)
            best = np.maximum(-(-fresh.sum(axis=1) // BANKS), 1)
            requests += words.shape[0]
            wavefronts, ideal = wavefronts + int(passes.sum()), ideal + int(best.sum())
            worst = max(worst, int(passes.max(initial=0)))
            continue
        for k in range(max((len(lane) for lane in lanes), default=0)):
            passes, best = bank_passes([(int(lane[k][0]), int(lane[k][1])) for lane in lanes if len(lane) > k])
            requests, wavefronts, ideal, worst = requests + 1, wavefronts + passes, ideal + best, max(worst, passes)
    return SharedTraffic(requests, wavefronts, ideal, worst)
