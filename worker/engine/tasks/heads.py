"""Postprocess for the tasks beyond `embed`: the forward pass's rows -> the request's Result.

score: a cross-encoder's logit through its activation (CrossEncoder.predict's), the cosine of two pooled
embeddings (a bi-encoder), or MaxSim over token vectors (ColBERT); classify: softmax over the labels
(sigmoid for one label), or the raw logits without activation; token_embed: each input's token vectors,
normalised per token when use_activation, back to back with their row counts (Result.parts); token_classify:
each token's labels through the same activation as classify, laid out as token_embed.
"""

from __future__ import annotations

import numpy as np

from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine.postprocess import cast
from embedfleet.worker.engine.seam import Prepared
from embedfleet.worker.engine.tasks.sparse import HEAD_PREFIX, finish_outputs


def finish_task(model, request: EmbedRequest, rows, prepared: Prepared) -> Result:
    if prepared.head.startswith(HEAD_PREFIX):  # a multi-head or sparse model's parts (worker/engine/tasks/sparse.py)
        return finish_outputs(model, request, rows, prepared)
    params, name = request.params, model.caps.name
    activate = bool(params.use_activation)
    if params.task == "token_embed":
        vectors = [_unit(v) if activate else np.asarray(v, np.float32) for v in rows]
        stored = cast(np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32), params.embed_dtype)
        return Result.success(request.id, name, stored, params.embed_dtype, params.endianness,
                              prepared.prompt_tokens).with_task("token_embed", parts=[len(v) for v in vectors])
    if params.task == "token_classify":  # vLLM's: the class activation over each token's labels
        rows = [np.asarray(v, np.float32).reshape(len(v), -1) for v in rows]
        values = [_classify_activation(v) if activate else v for v in rows]
        stored = np.concatenate(values) if values else np.zeros((0, len(model.caps.labels)), np.float32)
        return Result.success(request.id, name, stored, "float32", params.endianness,
                              prepared.prompt_tokens).with_task("token_classify", parts=[len(v) for v in values],
                                                                labels=model.caps.labels)
    if params.task == "classify":
        logits = np.asarray(rows, np.float32)
        values = _classify_activation(logits) if activate else logits
        return Result.success(request.id, name, values, "float32", params.endianness,
                              prepared.prompt_tokens).with_task("classify", labels=model.caps.labels)
    scores = _scores(model, rows, prepared, activate)
    return Result.success(request.id, name, scores.astype(np.float32), "float32", params.endianness,
                          prepared.prompt_tokens).with_task("score")


def _scores(model, rows, prepared: Prepared, activate: bool) -> np.ndarray:
    if model.caps.pooling == "classifier":  # one row of one logit per pair
        import torch  # noqa: PLC0415 - a cross-encoder's activation; a null-model worker never loads torch

        logits = torch.as_tensor(np.asarray(rows, np.float32))
        if activate:
            with torch.inference_mode():
                logits = model.score_activation(logits)
        return logits.numpy()[:, 0]
    half = len(rows) // 2  # first texts, then second texts (worker.engine.tasks.inputs)
    if prepared.head == "tokens":
        norm = _unit if activate else (lambda v: np.asarray(v, np.float32))
        return np.array([maxsim(norm(q), norm(d)) for q, d in zip(rows[:half], rows[half:])], np.float32)
    first, second = _unit(np.asarray(rows[:half])), _unit(np.asarray(rows[half:]))
    return (first * second).sum(axis=-1)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late interaction: for each query token its best document token, summed."""
    return float((query @ document.T).max(axis=1).sum())


def _unit(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def _classify_activation(logits: np.ndarray) -> np.ndarray:
    """vLLM's classify: softmax over the labels, sigmoid for a single label."""
    if logits.shape[-1] == 1:
        return 1 / (1 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
