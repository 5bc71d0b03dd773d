"""A served model's identity for the vector cache: its name, a digest of its files, and how it computes.

Two workers share cached vectors only when they would compute the same bytes: same weights and config
files (whatever folder or name they were loaded from), same serving dtype and same kind of device (CUDA and
CPU kernels round differently). Computed once at worker start.
"""

from __future__ import annotations

import hashlib
import os

_CHUNK = 1 << 20


def folder_digest(folder: str) -> str:
    """sha256 over every file under `folder` (relative path and content, in sorted order; symlinks into a
    hub cache followed; hidden files and folders such as .git or .cache skipped)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, folder).encode("utf-8", "surrogateescape") + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def model_identity(name: str, files_digest: str, dtype: str, device: str, engine: str = "torch") -> str:
    """The cache's model key part: 32 hex digits of (name, files digest, dtype, device kind, engine).
    `engine` is the label of worker/engine/backends (onnx, onnx-int8, ...); torch adds nothing, so torch
    workers keep the identities they had before there were engines."""
    kind = device.split(":", 1)[0]  # cuda:0 and cuda:1 compute alike
    parts = (name, files_digest, dtype, kind) + (() if engine == "torch" else (engine,))
    text = "\0".join(parts)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]
