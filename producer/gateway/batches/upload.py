"""POST /v1/files' multipart body read as it arrives, its file part written into Redis part by part.

Starlette's form parser would spool the file to a temporary file and the route would then read all of it
(a 64 MiB upload cost ~6x its size in gateway memory). Here the request stream goes through
python-multipart's push parser; the file's bytes go to a PartWriter (parts.py), so an upload holds about
one part and one received chunk, whatever the file's size. The other form fields are small (a few bytes:
purpose, expires_after) and are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header

from embedfleet.common.errors import PayloadTooLargeError, ValidationError
from embedfleet.producer.gateway.batches.parts import PartWriter

MAX_FIELD_BYTES = 1024  # a form field that is not the file (purpose, expires_after[...]) is a few bytes
MAX_FIELDS = 16


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)
    disposition: bytes = b""


class UploadReader:
    """The fields and the file (`file_field`) of one multipart body; the file's bytes go to `writer`."""

    def __init__(self, content_type: str, writer: PartWriter, max_file_bytes: int, file_field: str = "file"):
        kind, options = parse_options_header(content_type)
        if kind != b"multipart/form-data" or b"boundary" not in options:
            raise ValidationError("a file upload is a multipart/form-data body with a `file` part and a "
                                  f"`purpose` field, not {content_type or 'no Content-Type'}", param="file")
        self.writer = writer
        self.max_file_bytes = max_file_bytes
        self.file_field = file_field
        self.fields: dict[str, str] = {}
        self.filename: str | None = None  # set once the file part began
        self._part = _Part()
        self._header_name = b""
        self._header_value = b""
        self._pending: list[bytes] = []  # file bytes the last chunk held, written after the parser returns
        self._problem: Exception | None = None  # raised once the parser returns (callbacks cannot await)
        self._parser = MultipartParser(options[b"boundary"], {
            "on_part_begin": self._begin, "on_part_data": self._data, "on_part_end": self._end,
            "on_header_field": self._header_field, "on_header_value": self._header_value_cb,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_finished})

    async def feed(self, chunk: bytes) -> None:
        self._parser.write(chunk)
        if self._problem is not None:
            raise self._problem
        pending, self._pending = self._pending, []
        for data in pending:
            await self.writer.write(data)
        if self.writer.size > self.max_file_bytes:
            raise PayloadTooLargeError(f"the file is larger than this gateway's limit of {self.max_file_bytes} "
                                       "bytes (files are kept in Redis; --max-file-bytes): split the batch into "
                                       "several files", param="file")

    def finish(self) -> None:
        self._parser.finalize()
        if self._problem is not None:
            raise self._problem
        if self.filename is None:
            raise ValidationError("the upload has no file: send it as the multipart part `file`", param="file")

    # -- python-multipart's callbacks (synchronous: they only record) ------------------------------
    def _fail(self, err: Exception) -> None:
        self._problem = self._problem or err

    def _begin(self) -> None:
        self._part = _Part()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_cb(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._part.disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._part.disposition)
        self._part.name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._part.name == self.file_field:
            if self.filename is not None:
                self._fail(ValidationError("one file per upload: the body has two `file` parts", param="file"))
            self.filename = options.get(b"filename", b"upload.jsonl").decode("utf-8", "replace") or "upload.jsonl"
            self._part.filename = self.filename
        elif len(self.fields) >= MAX_FIELDS:
            self._fail(ValidationError(f"more than {MAX_FIELDS} form fields in the upload", param="file"))

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._problem is not None:
            return
        if self._part.filename is not None:
            self._pending.append(bytes(data[start:end]))
        elif len(self._part.data) + end - start > MAX_FIELD_BYTES:
            self._fail(ValidationError(f"form field {self._part.name!r} is longer than {MAX_FIELD_BYTES} bytes",
                                       param=self._part.name or None))
        else:
            self._part.data += data[start:end]

    def _end(self) -> None:
        if self._part.filename is None and self._problem is None:
            self.fields[self._part.name] = self._part.data.decode("utf-8", "replace")
