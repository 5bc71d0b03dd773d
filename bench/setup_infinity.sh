#!/usr/bin/env bash
# Make the separate venv bench/gateway.py runs Infinity from (bench only; never part of `make test`).
#   bash bench/setup_infinity.sh [VENV]        (default: ../.infvenv beside the checkout)
# torch is installed first and pinned, so that infinity-emb's own torch requirement is already met by the
# CPU build on local disk instead of pulling a multi-GB CUDA build; the script checks it was not replaced.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$here/../.infvenv}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
start=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$torch_pin"
before=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
"$venv/bin/pip" install -q "infinity-emb[server,torch]"
after=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
if [ "$before" != "$after" ]; then
    echo "infinity-emb replaced torch $before with $after in $venv" >&2
    exit 1
fi
"$venv/bin/python" -c 'import infinity_emb; print("infinity-emb", infinity_emb.__version__, end=" ")'
echo "with torch $after in $venv, installed in $(( $(date +%s) - start )) s"
