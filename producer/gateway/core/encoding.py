"""Results as HTTP answers: OpenAI embeddings lists, vLLM pooling lists, and vLLM's raw bytes framing.

Two base64 conventions meet here. OpenAI clients (the `openai` package sends base64 by default) decode
float32 little-endian, so /v1/embeddings answers that unless the client named `embed_dtype` or
`endianness` itself. vLLM's /pooling sends the bytes as stored, in the requested dtype and byte order.
"""

from __future__ import annotations

import base64
import json

import numpy as np
from fastapi.responses import JSONResponse, Response

from embedfleet.common.result import Result

_OPENAI_FLOAT = np.dtype("<f4")


def _usage(result: Result, completion: bool = False) -> dict:
    usage = {"prompt_tokens": result.usage.prompt_tokens, "total_tokens": result.usage.total_tokens}
    if completion:
        usage["completion_tokens"] = 0  # vLLM's UsageInfo carries it
    return usage


def _item_spans(result: Result) -> list[tuple[int, int, list[int]]]:
    """Each input's (start, end) in the stored bytes and its shape: one row, or (token_embed, Result.parts)
    its (tokens, d) rows."""
    n = result.shape[0]
    size = len(result.data) // n if n else 0
    if result.parts is None:
        return [(i * size, (i + 1) * size, list(result.shape[1:])) for i in range(n)]
    spans, start = [], 0
    for count in result.parts:
        spans.append((start * size, (start + count) * size, [count, *result.shape[1:]]))
        start += count
    return spans


def _stored_rows(result: Result) -> list[bytes]:
    """Each input's bytes exactly as the worker stored them (embed_dtype, byte order)."""
    return [result.data[start:end] for start, end, _ in _item_spans(result)]


def _vectors(result: Result, encoding_format: str, openai_base64: bool) -> list:
    if encoding_format == "float":
        if result.parts is not None:
            return [rows.tolist() for rows in result.multi_vectors]
        return result.embeddings.tolist()
    if openai_base64:
        rows = [row.tobytes() for row in np.asarray(result.embeddings, dtype=_OPENAI_FLOAT)]
    else:
        rows = _stored_rows(result)
    return [base64.b64encode(row).decode("ascii") for row in rows]


def _parts(result: Result, encoding_format: str) -> list:
    """A sparse or multi-output answer (common/result.py version 2): task sparse_embed gives {indices, values} per
    input; `outputs` an object per input with a key per output asked (dense: a vector, sparse: {indices,
    values}, colbert: a (tokens, d) array). base64 encodes the dense and ColBERT bytes as stored; sparse stays
    JSON."""
    names = {s.name for s in result.sections}
    count = result.shape[0]
    answer: list[dict] = [{} for _ in range(count)]
    if "sparse_ids" in names:
        for item, vector in zip(answer, result.sparse):
            item["sparse"] = {"indices": vector.indices.tolist(), "values": vector.values.tolist()}
    for name, rows in (("dense", lambda: list(result.dense)), ("colbert", lambda: result.colbert)):
        if name not in names:
            continue
        if encoding_format == "float":
            for item, row in zip(answer, rows()):
                item[name] = row.tolist()
        else:
            stored = result.section(name)
            stored = stored.astype(stored.dtype.newbyteorder("<" if result.endianness == "little" else ">"))
            parts = next(s.parts for s in result.sections if s.name == name) or [1] * count
            ends = np.cumsum(parts)
            for item, end, size in zip(answer, ends, parts):
                item[name] = base64.b64encode(stored[end - size:end].tobytes()).decode("ascii")
    if result.task == "sparse_embed":
        return [item["sparse"] for item in answer]
    return answer


def span_fields(result: Result, row: int) -> dict:
    """Late chunking: which input a row belongs to and the token / character range it pools (ends
    exclusive; no characters for token-id inputs). Nothing for one row per input."""
    if result.spans is None:
        return {}
    index, start, end, char_start, char_end = result.spans[row]
    return {"input_index": index, "token_span": [start, end],
            "char_span": None if char_start < 0 else [char_start, char_end]}


def metadata(result: Result) -> dict:
    """vLLM's `metadata` header for bytes answers: where each item's bytes start and end in the body."""
    return {
        "id": result.id, "created": int(result.finished_at), "model": result.model,
        "data": [{"index": i, "embed_dtype": result.embed_dtype, "endianness": result.endianness,
                  "start": start, "end": end, "shape": shape, **span_fields(result, i)}
                 for i, (start, end, shape) in enumerate(_item_spans(result))],
        "usage": _usage(result, completion=True),
    }


def bytes_response(result: Result, encoding_format: str) -> Response:
    """`bytes`: the stored rows back to back plus a JSON `metadata` header; `bytes_only`: the body alone."""
    headers = None
    if encoding_format == "bytes":
        headers = {"metadata": json.dumps(metadata(result), separators=(",", ":"))}
    return Response(content=result.data, media_type="application/octet-stream", headers=headers)


def embeddings_body(result: Result, encoding_format: str, explicit_layout: bool) -> dict:
    """OpenAI's CreateEmbeddingResponse (plus the request id and vLLM's `created`)."""
    vectors = _vectors(result, encoding_format, openai_base64=not explicit_layout)
    return {
        "id": result.id, "object": "list", "created": int(result.finished_at), "model": result.model,
        "data": [{"object": "embedding", "index": i, "embedding": v, **span_fields(result, i)}
                 for i, v in enumerate(vectors)],
        "usage": _usage(result),
    }


def embeddings_response(result: Result, encoding_format: str, explicit_layout: bool,
                        extra: dict | None = None) -> Response:
    """The JSON list, or vLLM's bytes framing for `bytes`/`bytes_only` (vLLM answers those here too)."""
    if encoding_format in ("bytes", "bytes_only"):
        return bytes_response(result, encoding_format)
    return JSONResponse({**embeddings_body(result, encoding_format, explicit_layout), **(extra or {})})


def pooling_response(result: Result, encoding_format: str) -> Response:
    """vLLM's PoolingResponse: `data[i].data` holds the vector (floats or base64 of the stored bytes)."""
    if encoding_format in ("bytes", "bytes_only"):
        return bytes_response(result, encoding_format)
    vectors = _parts(result, encoding_format) if result.sections is not None else \
        _vectors(result, encoding_format, openai_base64=False)
    return JSONResponse({
        "id": result.id, "object": "list", "created": int(result.finished_at), "model": result.model,
        "data": [{"object": "pooling", "index": i, "data": v, **span_fields(result, i)} for i, v in enumerate(vectors)],
        "usage": _usage(result, completion=True),
    })
