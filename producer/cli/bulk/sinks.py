"""Writing a finished bulk run: .npy (vectors), .parquet (id + embedding), .jsonl (one object a line), or an
OpenAI batch output file. Always to a temp file in the output's folder, renamed over OUTPUT at the end, so
OUTPUT is either absent (or the previous file) or whole."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from embedfleet.common.errors import ValidationError
from embedfleet.common.result import Result

OUTPUT_FORMATS = (".npy", ".parquet", ".jsonl")
SPARSE_FORMATS = (".parquet", ".jsonl")
ROW_GROUP_ROWS = 65_536  # parquet rows per row group (a reader's unit of work)
_STATUS = {"invalid_request": 400, "input_too_long": 400, "model_not_found": 404, "no_worker": 503}


def check_output(path: Path, batch: bool) -> None:
    """Refuse an output format the input cannot give, before any work is done."""
    suffix = path.suffix.lower()
    if batch and suffix != ".jsonl":
        raise ValidationError(f"{path}: a batch input (OpenAI batch JSONL) gives a batch output; name it .jsonl")
    if suffix not in OUTPUT_FORMATS:
        raise ValidationError(f"{path}: unknown output format {path.suffix or '(no suffix)'!r}; the output must "
                              f"be one of {', '.join(OUTPUT_FORMATS)}")
    if not path.parent.is_dir():
        raise ValidationError(f"{path}: the folder {path.parent} does not exist")


def check_replace(path: Path, source: Path, overwrite: bool, resuming: bool) -> None:
    """Refuse, before any work is done, an OUTPUT that is a folder or the input itself (even with --overwrite:
    an OpenAI batch file in and out are both .jsonl), or one that exists, unless `overwrite` or `resuming`
    (OUTPUT's checkpoint is there: "rerun the same command" goes on with the stopped run as it began)."""
    if path.is_dir():
        raise ValidationError(f"{path} is a folder; name the output file in it (e.g. {path / 'vectors.npy'})")
    if path.exists() and source.exists() and os.path.samefile(path, source):
        raise ValidationError(f"{path} is the input itself; choose another OUTPUT")
    if (path.exists() or path.is_symlink()) and not overwrite and not resuming:
        raise ValidationError(f"{path} exists; pass --overwrite to replace it (or choose another OUTPUT)")


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temp path beside `path`, renamed to `path` if the block ends well, removed if not."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_texts(path: Path, ids: list, results: Iterable[Result], rows: int) -> tuple[tuple[int, int], str]:
    """The vectors of `results` (in order; `rows` in all) with their `ids`; returns (shape, dtype)."""
    suffix = path.suffix.lower()
    arrays = (result.embeddings for result in results)
    with atomic(path) as tmp:
        if suffix == ".npy":
            shape, dtype = _npy(tmp, arrays, rows)
        elif suffix == ".parquet":
            shape, dtype = _parquet(tmp, ids, arrays)
        else:
            shape, dtype = _jsonl(tmp, ids, arrays)
    return shape, dtype


def check_sparse_output(path: Path) -> None:
    """Sparse vectors have no fixed width: they go to Parquet or JSONL, not to one .npy array."""
    if path.suffix.lower() not in SPARSE_FORMATS:
        raise ValidationError(f"{path}: sparse vectors (--sparse) are written as {' or '.join(SPARSE_FORMATS)} "
                              "(token_ids + weights per text), not as one .npy array")


def write_sparse(path: Path, ids: list, results: Iterable[Result]) -> int:
    """The sparse vectors of `results` (in order) with their `ids`: Parquet columns id, token_ids (list<int32>),
    weights (list<float32>), or JSONL {"id", "token_ids", "weights"} a line. Returns the rows written."""
    vectors = (vector for result in results for vector in result.sparse)
    with atomic(path) as tmp:
        if path.suffix.lower() == ".parquet":
            return _sparse_parquet(tmp, ids, vectors)
        row = 0
        with tmp.open("w", encoding="utf-8") as handle:
            for row, vector in enumerate(vectors, 1):
                handle.write(json.dumps({"id": ids[row - 1], "token_ids": vector.indices.tolist(),
                                         "weights": vector.values.tolist()}) + "\n")
        return row


def _sparse_parquet(tmp: Path, ids: list, vectors) -> int:
    import pyarrow as pa  # noqa: PLC0415 - only parquet needs pyarrow (the [cli] extra)
    import pyarrow.parquet as pq  # noqa: PLC0415

    id_type = pa.int64() if all(isinstance(i, int) for i in ids) else pa.string()
    ids = ids if id_type == pa.int64() else [str(i) for i in ids]
    schema = pa.schema([("id", id_type), ("token_ids", pa.list_(pa.int32())), ("weights", pa.list_(pa.float32()))])
    done, pending = 0, []
    with pq.ParquetWriter(tmp, schema) as writer:
        def flush():
            nonlocal done, pending
            columns = [pa.array(ids[done:done + len(pending)], id_type),
                       pa.array([v.indices for v in pending], pa.list_(pa.int32())),
                       pa.array([v.values for v in pending], pa.list_(pa.float32()))]
            writer.write_table(pa.table(columns, schema=schema))
            done, pending = done + len(pending), []

        for vector in vectors:
            pending.append(vector)
            if len(pending) >= ROW_GROUP_ROWS:
                flush()
        if pending:
            flush()
    return done


def _npy(tmp: Path, arrays: Iterator[np.ndarray], rows: int) -> tuple[tuple[int, int], str]:
    """The bytes np.save writes for the whole array, written one chunk at a time (never all in memory)."""
    first = next(arrays)
    header = {"descr": np.lib.format.dtype_to_descr(first.dtype), "fortran_order": False,
              "shape": (rows, first.shape[1])}
    written = 0
    with tmp.open("wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        for array in _chain(first, arrays):
            _same_layout(first, array)
            handle.write(np.ascontiguousarray(array).tobytes())
            written += len(array)
    if written != rows:  # the header promised `rows`: never rename a file that lies about its shape
        raise ValidationError(f"the fleet answered {written} vectors for {rows} texts; rerun with --no-resume")
    return (rows, first.shape[1]), str(first.dtype)


def _parquet(tmp: Path, ids: list, arrays: Iterator[np.ndarray]) -> tuple[tuple[int, int], str]:
    import pyarrow as pa  # noqa: PLC0415 - only parquet needs pyarrow (the [cli] extra)
    import pyarrow.parquet as pq  # noqa: PLC0415

    id_type = pa.int64() if all(isinstance(i, int) for i in ids) else pa.string()
    ids = ids if id_type == pa.int64() else [str(i) for i in ids]
    first = next(arrays)
    dim = first.shape[1]
    schema = pa.schema([("id", id_type), ("embedding", pa.list_(pa.from_numpy_dtype(first.dtype), dim))])
    done, pending = 0, []
    with pq.ParquetWriter(tmp, schema) as writer:
        def flush():
            nonlocal done, pending
            block = np.concatenate(pending)
            values = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), dim)
            writer.write_table(pa.table([pa.array(ids[done:done + len(block)], id_type), values], schema=schema))
            done, pending = done + len(block), []

        for array in _chain(first, arrays):
            _same_layout(first, array)
            pending.append(array)
            if sum(len(a) for a in pending) >= ROW_GROUP_ROWS:
                flush()
        if pending:
            flush()
    return (done, dim), str(first.dtype)


def _jsonl(tmp: Path, ids: list, arrays: Iterator[np.ndarray]) -> tuple[tuple[int, int], str]:
    row, first = 0, None
    with tmp.open("w", encoding="utf-8") as handle:
        for array in arrays:
            first = array if first is None else first
            _same_layout(first, array)
            for vector in array.tolist():
                handle.write(json.dumps({"id": ids[row], "embedding": vector}) + "\n")
                row += 1
    return (row, first.shape[1]), str(first.dtype)


def _chain(first, rest):
    yield first
    yield from rest


def _same_layout(first: np.ndarray, array: np.ndarray) -> None:
    if array.shape[1:] != first.shape[1:] or array.dtype != first.dtype:
        raise ValidationError(f"the fleet answered {array.shape[1]}-dimensional {array.dtype} vectors after "
                              f"{first.shape[1]}-dimensional {first.dtype} ones: were workers of another model "
                              "serving this name? rerun with --no-resume")


# -- OpenAI batch output -----------------------------------------------------------------------------------

def write_batch(path: Path, lines: Iterable[tuple[str, str, Result]]) -> int:
    """One output line per (custom_id, encoding_format, result), as OpenAI's batch output (and vLLM's
    run-batch) has them; the line's ids are derived from its position, so a resumed run writes the same
    bytes as an uninterrupted one. Returns the number of lines that failed."""
    failed = 0
    with atomic(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for n, (custom_id, encoding_format, result) in enumerate(lines):
            failed += not result.ok
            error = None if result.ok else {"message": result.error_message, "type": "invalid_request_error",
                                             "param": result.error_param, "code": result.error_code}
            handle.write(json.dumps({"id": f"batch_req_{n}", "custom_id": custom_id,
                                     "response": _response(n, encoding_format, result, error),
                                     "error": error}) + "\n")
    return failed


def _response(n: int, encoding_format: str, result: Result, error: dict | None) -> dict:
    # A failed line carries its error twice: in the response body with its 4xx status, as OpenAI's batch
    # output has it, and in `error`, where vLLM's run-batch puts it; a reader of either finds it.
    if error is not None:
        return {"status_code": _STATUS.get(result.error_code or "", 400), "request_id": f"embedfleet-batch-{n}",
                "body": {"error": error}}
    vectors = result.embeddings
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding_format == "base64"
             else v.tolist()} for i, v in enumerate(vectors)]
    body = {"object": "list", "data": data, "model": result.model,
            "usage": {"prompt_tokens": result.usage.prompt_tokens, "total_tokens": result.usage.total_tokens}}
    return {"status_code": 200, "request_id": f"embedfleet-batch-{n}", "body": body}
