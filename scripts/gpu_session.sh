#!/usr/bin/env bash
# One call on a lent NVIDIA GPU machine (the device tool's `run`): the GPU tests, the corpus against XLA (float32
# and float64) and the device timings of the benchmark cases with and without the block tiles, every result a
# file under $OUT. It installs nothing: it expects the machine's image (python3 with JAX's CUDA build, numpy,
# rich, pytest, cuda-bindings and NVRTC; /work/.library/device/KINDS.md) and runs tullax from this tree.
#
#   device run:  bash scripts/gpu_session.sh        (timeout_s 560; about 8 minutes of steps, each capped)
#
# Files in $OUT (at most 8 come back): env.txt, tests.log, session.log, tiles_on/gpu-<device>.{json,md},
# tiles_off/gpu-<device>.{json,md}, summary.md. A step that fails or runs out of time is recorded and the next
# one runs. Nothing here changes the card's settings.
set -u
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT/tiles_on" "$OUT/tiles_off"
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
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    $PY --version 2>&1
    $PY -c "import jax, numpy; print('jax', jax.__version__, jax.devices(), 'numpy', numpy.__version__)" 2>&1
    $PY -c "from tullax.backends.cuda.compile import nvrtc_version; print('nvrtc', nvrtc_version())" 2>&1
    $PY -c "from tullax import backends; print('cuda backend', backends.get('cuda').availability())" 2>&1
} >"$OUT/env.txt"

printf '# GPU session\n\n| step | exit | seconds |\n|---|---|---|\n' >"$OUT/summary.md"

# 1. The tests that need a GPU or NVRTC (each skips where it cannot run): the cuda backend on the device against
#    XLA (jit, grad, vmap, shard_map; the block-tiled Dist and Linear shapes included), and the NVRTC builds of
#    the cooperative and block-tiled kernels.
step tests 140 "$PY" -m pytest -q -rs -p no:cacheprovider \
    tests/test_gpu_device.py tests/test_cuda_compile_tiles.py tests/test_cuda_compile_cooperative.py
cp "$LOG" "$OUT/tests.log"

# 2. The corpus against XLA in float32 and float64, then the device time of every kernel of the benchmark cases
#    (CUDA events, roofline) with the block tiles, and the forward/backward timings of Dist and Linear.
step corpus_and_device 250 "$PY" benchmarks/gpu.py --parts corpus,device,timings --case-limit 60 \
    --cases "Dist K=784 I=1024 J=512,Dist I=J=4096 K=64,Linear,row logsumexp" --out-dir "$OUT/tiles_on"

# 3. The same device timings of Dist and Linear without the block tiles (the schedules before them).
step device_untiled 100 env TULLAX_CUDA_TILES=0 "$PY" benchmarks/gpu.py --parts device,timings --case-limit 40 \
    --cases "Dist K=784 I=1024 J=512,Linear" --out-dir "$OUT/tiles_off"

{
    echo
    for dir in tiles_on tiles_off; do
        echo "## $dir"
        for md in "$OUT/$dir"/*.md; do [ -f "$md" ] && cat "$md"; done
        echo
    done
} >>"$OUT/summary.md"
tail -n 60 "$OUT/summary.md"
