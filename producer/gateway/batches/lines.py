"""A batch's input file read into lines, and each line's answer written in OpenAI's batch output format.

A file that cannot be read as a batch (a line not UTF-8, a line that is no JSON object, a missing or repeated
`custom_id`, another endpoint or method) fails the whole batch at validation, with `errors` naming each
bad line, as OpenAI does. A line whose `body` is no valid /v1/embeddings body fails alone: its error line
carries the very 400 the route would answer for that body, or its 413 for a body over the route's byte or key
limit (a body of 200,000 unknown keys, validated, would hold the event loop for minutes: core/limits.py).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.errors import EmbedfleetError, PayloadTooLargeError, ValidationError, echo, invalid_request
from embedfleet.common.names import untagged
from embedfleet.common.protocol import batchkeys
from embedfleet.common.redisurls import cluster_tag
from embedfleet.producer.client.placement import partition_of
from embedfleet.producer.gateway.core.errors import error_response, status_of
from embedfleet.producer.gateway.core.limits import json_keys_over, too_many_keys
from embedfleet.producer.gateway.core.schemas import EmbedBody

ENDPOINT = "/v1/embeddings"
MAX_ERRORS = 100  # file errors reported in a failed batch's `errors` (the first ones)
# OpenAI's wording for lines that never ran (its batch guide's error codes)
UNRUN = {
    "cancelled": ("batch_cancelled", "This request could not be executed before the batch was cancelled."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
}


@dataclass(frozen=True)
class Line:
    """One request of a batch: its place, its custom_id and its body, or the error that body gets."""

    index: int  # 0-based among the file's requests (blank lines are not requests)
    custom_id: str
    body: EmbedBody | None
    error: EmbedfleetError | None = None


@dataclass(frozen=True)
class FileError:
    """Why the file is no batch file: OpenAI's BatchError (code, line, message, param)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def as_dict(self) -> dict:
        return {"code": self.code, "line": self.line, "message": self.message, "param": self.param}


class Reader:
    """A batch file's requests, from its bytes fed in pieces of any size (its parts, as they are read).

    Lines end at b"\n" only, as OpenAI splits a batch file: U+2028, U+0085 and the other characters
    `str.splitlines` also breaks at are legal inside a JSON string and stay in their line. A line's body is
    held to the route's body limits (`max_body_bytes`, `max_body_keys`): one over either fails alone with the
    route's 413.
    """

    def __init__(self, endpoint: str = ENDPOINT, max_body_bytes: int | None = None, max_body_keys: int | None = None):
        self.endpoint = endpoint
        self.max_body_bytes = max_body_bytes
        self.max_body_keys = max_body_keys
        self.lines: list[Line] = []
        self.errors: list[FileError] = []
        self._seen: set[str] = set()
        self._carry = b""  # the start of a line whose end is in a later piece
        self._number = 0  # lines read so far (1-based numbers, blank lines counted, as an editor shows them)
        self._offset = 0  # bytes read before the current line (for a UTF-8 error's position)

    def feed(self, data: bytes) -> None:
        pieces = (self._carry + data).split(b"\n")
        self._carry = pieces.pop()
        for raw in pieces:
            self._read(raw)

    def finish(self) -> tuple[list[Line], list[FileError]]:
        """The file's requests, or (when the file cannot be run) the reasons, at most MAX_ERRORS of them."""
        if self._carry:
            self._read(self._carry)
            self._carry = b""
        if not self.lines and not self.errors:
            self.errors.append(FileError("empty_file", "the file holds no requests: one JSON object per line, "
                                                       f"each with custom_id, method POST, url {self.endpoint} "
                                                       "and body"))
        if len(self.lines) > batchkeys.MAX_BATCH_LINES:
            self.errors.append(FileError("too_many_requests", f"the file holds {len(self.lines)} requests; a batch "
                                                              f"holds at most {batchkeys.MAX_BATCH_LINES}"))
        return self.lines, self.errors

    def _read(self, raw: bytes) -> None:
        self._number += 1
        start, self._offset = self._offset, self._offset + len(raw) + 1
        if len(self.errors) >= MAX_ERRORS:
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.errors.append(FileError("invalid_file", f"the file is not UTF-8 text (byte {start + exc.start}, "
                                                         f"line {self._number}); a batch file is JSON lines, one "
                                                         "request object per line", self._number))
            return
        if not text.strip():
            return
        found = _request(text, self._number, self.endpoint, self._seen)
        if isinstance(found, FileError):
            self.errors.append(found)
            return
        custom_id, body = found
        self._seen.add(custom_id)
        self.lines.append(_line(len(self.lines), custom_id, body, raw, self.max_body_bytes, self.max_body_keys))


def parse(data: bytes, endpoint: str = ENDPOINT, max_body_bytes: int | None = None, max_body_keys: int | None = None
          ) -> tuple[list[Line], list[FileError]]:
    """The requests of a whole file in memory (Reader, in one piece)."""
    reader = Reader(endpoint, max_body_bytes, max_body_keys)
    reader.feed(data)
    return reader.finish()


def _request(raw: str, number: int, endpoint: str, seen: set[str]) -> tuple[str, dict] | FileError:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as exc:
        return FileError("invalid_json_line", f"line {number} is not valid JSON ({exc.msg}); each line is one "
                                              "request object", number)
    if not isinstance(item, dict):
        return FileError("invalid_request", f"line {number} is not a JSON object", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return FileError("missing_required_parameter", f"line {number} has no text `custom_id`", number,
                         "custom_id")
    if custom_id in seen:
        return FileError("duplicate_custom_id", f"custom_id {echo(repr(custom_id))} on line {number} is used by an "
                                                "earlier line: each request needs its own", number, "custom_id")
    if item.get("method", "POST") != "POST":
        return FileError("invalid_method", f"line {number}: method {echo(repr(item.get('method')))} is not supported; "
                                           "only POST", number, "method")
    if item.get("url") != endpoint:
        return FileError("invalid_url", f"line {number}: url {echo(repr(item.get('url')))} does not match the batch's "
                                        f"endpoint {endpoint}", number, "url")
    if not isinstance(item.get("body"), dict):
        return FileError("invalid_request", f"line {number}: `body` must be a JSON object (a {endpoint} "
                                            "request body)", number, "body")
    return custom_id, item["body"]


def _line(index: int, custom_id: str, body: dict, raw: bytes, max_body_bytes: int | None,
          max_body_keys: int | None) -> Line:
    """Validate the body as the route does (EmbedBody, the same message for the same mistake), its size and
    keys first: the body as its shortest JSON is what a client would send the route at least. Each limit is
    checked on the whole line first, which holds the body: the body is dumped only for a line over one."""
    if max_body_bytes is not None and len(raw) > max_body_bytes:  # else the body, inside the line, is shorter
        size = len(_dump(body))
        if size > max_body_bytes:
            return Line(index, custom_id, None, PayloadTooLargeError(
                f"request body too large: this line's body is {size} bytes as JSON; the limit is {max_body_bytes} "
                "bytes, as on the route (send fewer or shorter inputs per request)", param="body"))
    if max_body_keys is not None and json_keys_over(raw, max_body_keys) and json_keys_over(_dump(body), max_body_keys):
        return Line(index, custom_id, None, too_many_keys(max_body_keys, param="body"))
    try:
        parsed = EmbedBody.model_validate(body)
    except PydanticValidationError as exc:
        return Line(index, custom_id, None, invalid_request(exc.errors()))
    if parsed.encoding_format in ("bytes", "bytes_only"):
        return Line(index, custom_id, None, ValidationError(
            f"encoding_format {parsed.encoding_format!r} is not available in a batch (each output line is JSON): "
            "use 'float' or 'base64'", param="encoding_format"))
    return Line(index, custom_id, parsed)


# -- output lines ---------------------------------------------------------------------------------------

def _dump(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def request_id_of(batch_id: str, index: int, model: str | None, partitions: list[str]) -> str:
    """The request id line `index` runs as (batchkeys.batch_line_request_id), fixed before its submit so that every
    replica submits it under the same id. On a Redis Cluster (`partitions`: the URLs of `model`) it starts
    with the hash tag of the model's partition it goes to (cluster_tag: that partition's queue slot); a model
    in several partitions sends a chosen id to partition_of(id), so the id is the first, in a fixed order (a
    `-<n>` suffix after the first round), whose own tag is that of the partition it goes to."""
    base = batchkeys.batch_line_request_id(batch_id, index)
    tags = [cluster_tag(url, model) for url in partitions] if model is not None else []
    if not any(tags):
        return base
    for round_ in itertools.count():
        for url, tag in zip(partitions, tags):
            request_id = f"{tag}{base}-{round_}" if round_ else tag + base
            if partition_of(partitions, request_id) == url:
                return request_id
    raise AssertionError("unreachable")  # pragma: no cover


def line_id(request_id: str) -> str:
    """The output line's `id` (batch_req_...): the request id without its hash tag and `batch_` prefix."""
    return f"batch_req_{untagged(request_id).removeprefix('batch_')}"


def answered(line: Line, request_id: str, status_code: int, body: bytes) -> bytes:
    """The output line of an answered request; `body` is spliced in as the route's own bytes."""
    return b"".join([b'{"id":', _dump(line_id(request_id)), b',"custom_id":', _dump(line.custom_id),
                     b',"response":{"status_code":', str(status_code).encode(), b',"request_id":',
                     _dump(request_id), b',"body":', body, b'},"error":null}'])


def failed(line: Line, request_id: str, err: EmbedfleetError) -> bytes:
    """The error line of a request the route would refuse or that failed: the route's status and body."""
    response = error_response(err, 0, lambda code: None, ENDPOINT)
    return answered(line, request_id, status_of(err.code), response.body)


def unrun(line: Line, request_id: str, why: str) -> bytes:
    """The error line of a request that never ran (the batch was cancelled or expired)."""
    code, message = UNRUN[why]
    return _dump({"id": line_id(request_id), "custom_id": line.custom_id, "response": None,
                  "error": {"code": code, "message": message}})

