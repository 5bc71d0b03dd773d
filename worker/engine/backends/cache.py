"""Where exported engines live: one folder per (model files, engine, quantisation, versions), built once.

An export is keyed by the digest of the model folder's files (worker/engine/identity.py), the engine and
its quantisation, and the versions that shape the file (the exporter's, the runtime's, ours): a new
checkpoint or a new runtime gets a new export, never a stale one. A folder is written under a temporary
name and renamed into place, so two workers starting on one host never read a half-written export.

    <root>/<key>/model.onnx            --engine onnx (graph fused by onnxruntime's transformer optimizer)
    <root>/<key>/model.onnx + model_int8.onnx         --engine onnx --quantize int8
    <root>/<key>/openvino_model.xml (+ .bin)          --engine openvino [--quantize int8]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

FORMAT = 1  # bump when what an export folder holds changes: old folders are then left unused


def default_root() -> str:
    """${XDG_CACHE_HOME:-~/.cache}/embedfleet/engines (the flag --engine-cache-dir overrides it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return os.path.join(base, "embedfleet", "engines")


def export_key(files_digest: str, engine: str, quantize: str | None, versions: dict[str, str]) -> str:
    """32 hex digits naming one export folder."""
    parts = [f"format={FORMAT}", files_digest, engine, quantize or "none"]
    parts += [f"{name}={version}" for name, version in sorted(versions.items())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def cached(root: str, key: str, build: Callable[[str], None], marker: str) -> str:
    """The export folder for `key`, building it with `build(folder)` when absent; `marker` is the file a
    complete folder holds."""
    folder = os.path.join(root, key)
    if os.path.isfile(os.path.join(folder, marker)):
        return folder
    os.makedirs(root, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{key}-", dir=root)
    try:
        build(scratch)
        if not os.path.isfile(os.path.join(scratch, marker)):
            raise RuntimeError(f"the export wrote no {marker}")
        try:
            os.rename(scratch, folder)
        except OSError:  # another worker on this host finished the same export first: use theirs
            if not os.path.isfile(os.path.join(folder, marker)):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
