"""The null model (`--model null:<dim>`): a fixed unit vector for every input, with no tokenizer and no
compute, served through the same queue, verification, post-processing and result path as a real model.
Operators use it to size Redis and the gateway; benchmarks use it to measure the queue path alone."""

from __future__ import annotations

import re

import numpy as np

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.seam import Prepared

PREFIX = "null:"
_SPEC = re.compile(r"null:(\d{1,5})")


def is_null(spec: str | None) -> bool:
    return bool(spec) and spec.startswith(PREFIX)


class NullModel:
    """A Model (worker/engine/models/base.py) that tokenises its own way (`prepare`): each input counts as one
    token (usage.prompt_tokens = number of inputs)."""

    device = "none"
    fidelity = 1.0

    def __init__(self, spec: str, served_name: str | None = None, max_inputs: int = 2048):
        match = _SPEC.fullmatch(spec)
        if not match or not 1 <= int(match.group(1)) <= 65536:
            raise ValueError(f"null model spec {spec!r}: expected null:<dimensions>, dimensions 1 to 65536, "
                             "e.g. null:384")
        dim = int(match.group(1))
        self.caps = ModelCapabilities(name=served_name or spec, max_model_len=1 << 20, embedding_size=dim,
                                      vocab_size=2**31 - 1, pooling="none", normalize=True, is_matryoshka=True,
                                      max_inputs=max_inputs)
        self._vector = np.full(dim, 1 / np.sqrt(dim), np.float32)

    def prepare(self, request: EmbedRequest) -> Prepared:
        return Prepared([[0]] * len(request.inputs))

    def embed(self, token_lists: list[list[int]], prompt_lengths: list[int] | None = None) -> np.ndarray:
        return np.broadcast_to(self._vector, (len(token_lists), len(self._vector)))
