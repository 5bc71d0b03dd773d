"""The tasks of multi-head and sparse models (bge-m3: worker/engine/models/bgem3.py, SPLADE: models/splade.py):
which heads a request's forward pass computes, and how their rows become its Result.

A request is routed here when the model gives several outputs from one pass (caps.outputs) and the request asks
for one of them: `outputs` (several at once), sparse_embed, token_embed and token_classify on bge-m3 (its ColBERT
vectors and its per-token lexical weights, as vLLM serves them), and score with `score_weights`. Its Prepared
head is "outputs:" + the heads joined by "+", so that the batcher never mixes passes that compute different
heads (worker/engine/batcher.py) and the engine hands the names to `model.outputs`.
"""

from __future__ import annotations

import numpy as np

from embedfleet.common.errors import InputTooLongError
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine.postprocess import cast, cut_and_normalise
from embedfleet.worker.engine.preprocess import prepare
from embedfleet.worker.engine.seam import Prepared

HEAD_PREFIX = "outputs:"


def head_outputs(head: str) -> tuple[str, ...]:
    """The model heads a Prepared head names ("outputs:dense+sparse" -> ("dense", "sparse"))."""
    return tuple(head.removeprefix(HEAD_PREFIX).split("+"))


def wanted(model, request: EmbedRequest) -> tuple[str, ...] | None:
    """The heads a request needs from a multi-head or sparse model's pass, or None: the ordinary paths serve it."""
    params, outputs = request.params, model.caps.outputs
    if not outputs:
        return None
    if params.outputs is not None:
        return tuple(o for o in ("dense", "sparse", "colbert") if o in params.outputs)  # one order: one head
    if params.task == "sparse_embed":
        return ("sparse",)
    if "colbert" in outputs and params.task == "token_embed":
        return ("colbert",)
    if "colbert" in outputs and params.task == "token_classify":
        return ("lexical",)
    if params.task == "score" and params.score_weights is not None:
        return ("dense", "sparse", "colbert")
    return None


def prepare_outputs(model, request: EmbedRequest, heads: tuple[str, ...]) -> Prepared:
    """Tokenise as for embed (a score's two sides as rows of their own, first texts then seconds). An input
    past the max length is refused even with --max-embed-len: token weights and token vectors of chunks read
    apart are no answer for the whole input."""
    if request.params.task == "score":
        request = request.model_copy(update={"inputs": list(request.inputs) + list(request.text_pair),
                                             "text_pair": None})
    prepared = prepare(model, request)
    if prepared.owners is not None:
        index = next(i for k, i in enumerate(prepared.owners) if k and prepared.owners[k - 1] == i)
        caps = model.caps
        raise InputTooLongError(
            f"input {index} is longer than the maximum {caps.max_model_len} tokens of model '{caps.name}': "
            "--max-embed-len embeds long inputs in chunks for dense vectors only, not for sparse or ColBERT "
            "outputs; shorten it, or send truncate_prompt_tokens=-1 to truncate to the maximum. Please reduce "
            "the length of the input prompt.", param="input")
    prepared.head = HEAD_PREFIX + "+".join(heads)
    return prepared


def finish_outputs(model, request: EmbedRequest, rows: list[dict], prepared: Prepared) -> Result:
    params, caps = request.params, model.caps
    heads, tokens = head_outputs(prepared.head), prepared.prompt_tokens
    activate = bool(params.use_activation)
    if params.task == "token_embed":
        vectors = [_unit(r["colbert"]) if activate else r["colbert"] for r in rows]
        stored = cast(np.concatenate(vectors), params.embed_dtype)
        return Result.success(request.id, caps.name, stored, params.embed_dtype, params.endianness,
                              tokens).with_task("token_embed", parts=[len(v) for v in vectors])
    if params.task == "token_classify":  # vLLM's bge-m3 token_classify: the ReLU'd weights, no other activation
        weights = [r["lexical"] for r in rows]
        return Result.success(request.id, caps.name, np.concatenate(weights), "float32", params.endianness,
                              tokens).with_task("token_classify", parts=[len(w) for w in weights],
                                                labels=("lexical_weight",))
    if params.task == "score":
        half = len(rows) // 2
        scores = [combined_score(q, d, params.score_weights) for q, d in zip(rows[:half], rows[half:])]
        return Result.success(request.id, caps.name, np.asarray(scores, np.float32), "float32", params.endianness,
                              tokens).with_task("score")
    arrays = []
    if "dense" in heads:
        dense = cut_and_normalise(np.stack([r["dense"] for r in rows]), params.dimensions, activate)
        arrays.append(("dense", cast(dense, params.embed_dtype), None))
    if "sparse" in heads:
        sparse = [_keep(*r["sparse"], params.sparse_top_k, params.sparse_threshold) for r in rows]
        parts = [len(ids) for ids, _ in sparse]
        arrays.append(("sparse_ids", np.concatenate([ids for ids, _ in sparse]).astype(np.int32), parts))
        arrays.append(("sparse_weights", np.concatenate([w for _, w in sparse]).astype(np.float32), parts))
    if "colbert" in heads:
        vectors = [_unit(r["colbert"]) if activate else r["colbert"] for r in rows]
        arrays.append(("colbert", cast(np.concatenate(vectors), params.embed_dtype), [len(v) for v in vectors]))
    return Result.of_sections(request.id, caps.name, params.task, len(rows), arrays, params.embed_dtype,
                              params.endianness, tokens, vocab_size=caps.vocab_size)


def _keep(ids: np.ndarray, weights: np.ndarray, top_k: int | None, threshold: float | None):
    """Weights above `threshold` (the rows hold only positive ones already), then the `top_k` largest (ties: the
    lower id first); ids stay ascending."""
    if threshold is not None:
        above = weights > threshold
        ids, weights = ids[above], weights[above]
    if top_k is not None and len(ids) > top_k:
        best = np.sort(np.lexsort((ids, -weights))[:top_k])
        ids, weights = ids[best], weights[best]
    return ids, weights


def combined_score(query: dict, document: dict, weights) -> float:
    """FlagEmbedding's compute_score: the weighted mean of the dense cosine, the lexical match (the sum of
    weight products over shared token ids) and ColBERT's MaxSim averaged over the query's vectors."""
    dense = float(_unit(query["dense"]) @ _unit(document["dense"]))
    (q_ids, q_weights), (d_ids, d_weights) = query["sparse"], document["sparse"]
    _, q_at, d_at = np.intersect1d(q_ids, d_ids, assume_unique=True, return_indices=True)
    sparse = float((q_weights[q_at].astype(np.float64) * d_weights[d_at]).sum())
    q_vectors, d_vectors = _unit(query["colbert"]), _unit(document["colbert"])
    colbert = float((q_vectors @ d_vectors.T).max(axis=1).sum() / max(len(q_vectors), 1)) if len(d_vectors) else 0.0
    w_dense, w_sparse, w_colbert = weights
    return (w_dense * dense + w_sparse * sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)


def _unit(vectors) -> np.ndarray:
    return cut_and_normalise(vectors, None, True)  # postprocess's L2 normalisation, along the last axis
