#!/usr/bin/env bash
# Every GPU check of this project in one command, for a GPU machine that is lent for minutes
# (docs/benchmarks.md "On a GPU" holds what it measured and how to read it):
#
#     bash tools/gpu_session.sh [OUT_DIR]          # ~7 min on one H200 with 16 cores
#
# 1. python3 tools/gpu_check.py: the CUDA path's checks and its throughput, one table;
# 2. python3 -m pytest -m cuda: tests/loader/test_cuda.py;
# 3. tools/bench/cuda_next.py: what next() with its batch ready costs after a pause, beside the
#    CUDA calls it makes;
# 4. tools/bench/gpu_train.py: a small GPT's training loop fed by shmloader, nanochat's loader
#    and that loader in a thread, against batches already on the GPU (the GPU's wait for data);
# 5. tools/bench/scaling.py --device cuda: tokens/s with 1, 2, 4, 8 and 14 workers against
#    the nanochat-style baseline and as many bare processes (engine only, and reading too),
#    B=32, T=2048, both packings, with the workers' and the coordinator's CPU.
#
# The machine needs python3 with a CUDA torch, pyarrow, tiktoken, numpy and pytest; wheels the
# project needs besides (fastokens, rustbpe, gigatoken, awkward) are installed from ./.whl if
# that folder exists (pip download --python-version 3.12 ..., as the device tool's README says).
# The corpora are built on the spot (seconds). Each step has its own time limit, so that one
# that hangs leaves the rest their time; the script's exit code is the number of steps failed.
set -u
OUT=${1:-${OUT:-gpu_out}}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
WHEELS=${WHEELS:-.whl}
# a dry run on a machine without a GPU: DEVICE=cpu PYTHON=.venv/bin/python WHEELS=none QUICK=1
TRAIN=(--workers 8 --warmup 10 --steps 60)
SCALE=(--workers 1 2 4 8 14 --batch-size 32 --seconds 3)
if [ -n "${QUICK:-}" ]; then
    TRAIN=(--workers 2 --quick --models tiny)
    SCALE=(--workers 1 2 --batch-size 4 --seconds 1)
fi
if [ -d "$WHEELS" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || { echo "gpu_session: the wheels in $WHEELS did not install"; exit 99; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
CORPUS=(--corpus nanochat --cache-dir /tmp/gpu_session_data --nanochat-docs 32768 --corpus-files 8)

failed=0
STEPS=${STEPS:-check pytest next train scaling}  # a rerun names the steps it needs
step() {  # step NAME LIMIT_S COMMAND...: run it under its limit, its output into $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    echo "=== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.txt"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || failed=$((failed + 1))
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    echo "cores: $(nproc); $(free -g | awk '/Mem:/ {print $2}') GiB"
    $PY -c "import sys, torch, pyarrow, tiktoken, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'pyarrow', pyarrow.__version__, 'tiktoken', tiktoken.__version__, 'numpy', numpy.__version__)"
    $PY -c "import fastokens, rustbpe, gigatoken; print('fastokens, rustbpe, gigatoken import')"
    ls /dev/shm | head
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step check 120 $PY tools/gpu_check.py --device "$DEVICE" --out-dir /tmp/gpu_check_data
step pytest 110 $PY -m pytest -q -m cuda -o addopts="-p no:cacheprovider" tests/loader/test_cuda.py
step next 60 $PY tools/bench/cuda_next.py --device "$DEVICE" --cache-dir /tmp/gpu_check_data --json "$OUT/cuda_next.json"
step train 140 $PY tools/bench/gpu_train.py --device "$DEVICE" "${CORPUS[@]}" "${TRAIN[@]}" --json "$OUT/gpu_train.json"
step scaling 170 $PY tools/bench/scaling.py --device "$DEVICE" "${CORPUS[@]}" "${SCALE[@]}" --repeat 1 \
    --json "$OUT/scaling.json"
echo "left in /dev/shm: $(ls /dev/shm | grep -c '^shml_') shmloader segments"
echo "gpu_session: $failed step(s) failed"
exit $failed
