#!/usr/bin/env bash
# One call on a lent NVIDIA GPU machine (the device tool's `run`): the GPU tests, the corpus against XLA (float32
# and float64) and the device timings of the benchmark cases with and without the block and window tiles (conv2d's
# implicit GEMM is switched by the same TULLAX_CUDA_TILES), every result a file under $OUT. It installs nothing: it expects the machine's image (python3 with JAX's CUDA build, numpy,
# rich, pytest, cuda-bindings and NVRTC; /work/.library/device/KINDS.md) and runs tullax from this tree.
#
#   device run:  bash scripts/gpu_session.sh        (timeout_s 590; the steps' caps add up to 9 min 20 s)
#   anywhere:    bash scripts/gpu_session.sh --dry-run   (no GPU: the chunked scan's schedules and NVRTC builds)
#
# Files in $OUT (10, what comes back at most): summary.md (the machine, each step's exit and seconds, the tables),
# session.log (everything printed), tiles_on/, tiles_off/ and corpus/gpu-<device>.{json,md}, scan/scan-gpu-<device>.
# {json,md}. The steps run most
# wanted first (the device timings with and without tiles, then the corpus); a step that fails or runs out of
# time is recorded and the next one runs. The NVRTC builds are checked on the CPU by the suite, not here.
# Nothing here changes the card's settings.
set -u
# --dry-run (any machine): what can be checked without a GPU, the chunked scan's schedules and NVRTC builds
if [ "${1:-}" = "--dry-run" ]; then
    PYTHONPATH=$PWD "${PYTHON:-python3}" benchmarks/scan_gpu.py --dry-run --lengths 1024 65536
    exit $?
fi
# without a GPU nothing here can run: refuse before writing anything (a dry run on a CPU machine ends here)
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_session.sh: no GPU here (nvidia-smi lists none): run it through the device tool on a lent GPU" >&2
    exit 2
fi
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT/tiles_on" "$OUT/tiles_off" "$OUT/scan" "$OUT/corpus"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TULLAX_CACHE_DIR=/tmp/tullax-gpu-cache XLA_PYTHON_CLIENT_PREALLOCATE=false
LOG=$OUT/session.log
: >"$LOG"

step() {  # step NAME SECONDS COMMAND...: run with a time cap, log its exit status
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "== $name (cap ${limit}s): $*" >>"$LOG"
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s" >>"$LOG"
    echo "| $name | $rc | $((SECONDS - start)) |" >>"$OUT/summary.md"
}

{
    echo '# GPU session'
    echo '```'
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    $PY --version 2>&1
    $PY -c "import jax, numpy; print('jax', jax.__version__, jax.devices(), 'numpy', numpy.__version__)" 2>&1
    $PY -c "from tullax.backends.cuda.compile import nvrtc_version; print('nvrtc', nvrtc_version())" 2>&1
    $PY -c "from tullax import backends; print('cuda backend', backends.get('cuda').availability())" 2>&1
    echo '```'
    printf '\n| step | exit | seconds |\n|---|---|---|\n'
} >"$OUT/summary.md"

# 1. The tests that need a GPU (skipped elsewhere): the cuda backend on the device against XLA, float32 and
#    float64 (jit, grad, vmap, shard_map; Dist's and Linear's block-tiled shapes with ragged edges included).
step gpu_tests 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu_device.py

# 2. Device time of every kernel of the benchmark cases (CUDA events around pipelined launches, roofline) with
#    the block tiles (Dist, Linear) and the window tiles (conv2d's forward and both gradients), the embedding
#    (its gather and scatter in 32-bit indices, the gradient's output cleared on XLA's stream), and the
#    forward/backward wall timings against XLA.
step device_tiled 230 "$PY" benchmarks/gpu.py --parts device,timings --case-limit 40 \
    --cases "Dist K=784 I=1024 J=512,Dist I=J=4096 K=64,Linear,row logsumexp,conv2d,embedding" \
    --out-dir "$OUT/tiles_on"

# 3. The same for Dist, Linear and conv2d without the tiles (the schedules before them), on the same card.
step device_untiled 70 env TULLAX_CUDA_TILES=0 "$PY" benchmarks/gpu.py --parts device,timings --case-limit 35 \
    --cases "Dist K=784 I=1024 J=512,Linear,conv2d" --out-dir "$OUT/tiles_off"

# 4. The chunked scan of a linear recurrence over few lanes (h = lam*h + x, 16 and 1024 lanes, T = 1024..65536)
#    against a thread per lane walking t (device time, forward and adjoint) and lax.scan (forward and grad).
step scan_chunks 60 "$PY" benchmarks/scan_gpu.py --rounds 2 --out-dir "$OUT/scan"

# 5. The corpus against XLA in float32 and float64 (every kernel, forward and gradients, backend='cuda').
step corpus 50 "$PY" benchmarks/gpu.py --parts corpus --out-dir "$OUT/corpus"

{
    echo
    for dir in tiles_on tiles_off scan corpus; do
        echo "## $dir"
        for md in "$OUT/$dir"/*.md; do [ -f "$md" ] && cat "$md"; done
        echo
    done
} >>"$OUT/summary.md"
tail -n 60 "$OUT/summary.md"
