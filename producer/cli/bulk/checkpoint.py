"""The bulk tool's checkpoint: an append-only log next to the output, from which a run resumes.

    OUTPUT.embedfleet-checkpoint    records, each: kind (1 byte) | unit (4) | length (4) | crc32 (4) | payload
        M  the run's fingerprint (JSON): input bytes' sha256 and every setting that changes the output;
           always the first record
        S  a unit was submitted: payload = the request id (so a restarted run waits for it, not a new copy)
        D  a unit is done: payload = its result blob (common.result), embeddings or a batch line's error

Records are written whole with one write() each. A run killed mid-write (SIGKILL, a crash, power loss)
leaves a torn last record: its length or crc does not match, and the log is cut back to the last whole
one. A unit done twice (a restart that collected a result the first run had logged) keeps its first record.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.common.errors import DecodeError, ValidationError
from embedfleet.common.result import Result

SUFFIX = ".embedfleet-checkpoint"
_HEAD = struct.Struct(">cIII")


def checkpoint_path(output: Path) -> Path:
    return output.with_name(output.name + SUFFIX)


def fingerprint(source: Path, settings: dict) -> dict:
    digest = hashlib.sha256()
    with source.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return {"version": 1, "input_sha256": digest.hexdigest(), **settings}


@dataclass
class State:
    """What the log says: units done (their results' offsets in the log) and units submitted, not done."""

    done: dict[int, tuple[int, int]] = field(default_factory=dict)  # unit -> (offset, length) of its blob
    submitted: dict[int, str] = field(default_factory=dict)  # unit -> request id


class Checkpoint:
    """Open (resuming a matching log, or starting a new one) with `open()`; `close()` or `discard()`."""

    def __init__(self, path: Path, manifest: dict):
        self.path = path
        self.manifest = manifest
        self.state = State()
        self._fd: int | None = None

    def open(self, resume: bool = True) -> State:
        """Read a log of the same run (cut at a torn record), or start a fresh one. A log of another input
        or other settings is refused unless `resume` is False (then it is replaced)."""
        if self.path.exists() and resume:
            self._read()
        else:
            self.path.unlink(missing_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._append(b"M", 0, json.dumps(self.manifest, sort_keys=True).encode())
        return self.state

    def submitted(self, unit: int, request_id: str) -> None:
        self.state.submitted[unit] = request_id
        self._append(b"S", unit, request_id.encode("ascii"))

    def done(self, unit: int, result: Result) -> None:
        if unit in self.state.done:
            return
        offset = os.lseek(self._fd, 0, os.SEEK_END)
        blob = result.encode()
        self._append(b"D", unit, blob)
        self.state.done[unit] = (offset + _HEAD.size, len(blob))
        self.state.submitted.pop(unit, None)

    def results(self):
        """(unit, Result) in unit order, read back from the log (never all held in memory)."""
        with self.path.open("rb") as handle:
            for unit in sorted(self.state.done):
                offset, length = self.state.done[unit]
                handle.seek(offset)
                yield unit, Result.decode(handle.read(length))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def _append(self, kind: bytes, unit: int, payload: bytes) -> None:
        record = _HEAD.pack(kind, unit, len(payload), zlib.crc32(payload)) + payload
        written = os.write(self._fd, record)
        if written != len(record):  # a full disk: never leave half a record that a later one follows
            raise OSError(f"short write to {self.path} ({written} of {len(record)} bytes); is the disk full?")

    def _read(self) -> None:
        data = self.path.read_bytes()
        position, first = 0, True
        while position + _HEAD.size <= len(data):
            kind, unit, length, crc = _HEAD.unpack_from(data, position)
            start = position + _HEAD.size
            payload = data[start:start + length]
            if len(payload) != length or zlib.crc32(payload) != crc or kind not in (b"M", b"S", b"D"):
                break  # a torn or damaged tail: everything from here is redone
            if first:
                self._check_manifest(kind, payload)
                first = False
            elif kind == b"S":
                self.state.submitted[unit] = payload.decode("ascii", "replace")
            elif kind == b"D" and unit not in self.state.done:
                try:
                    Result.decode(payload)
                except DecodeError:
                    break
                self.state.done[unit] = (start, length)
            position = start + length
        if first:  # not even a whole manifest: a run killed at its first write
            self.path.unlink()
            return self.open()
        for unit in self.state.done:
            self.state.submitted.pop(unit, None)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        os.ftruncate(self._fd, position)
        return None

    def _check_manifest(self, kind: bytes, payload: bytes) -> None:
        try:
            found = json.loads(payload) if kind == b"M" else None
        except ValueError:
            found = None
        if found != json.loads(json.dumps(self.manifest, sort_keys=True)):
            differ = sorted(k for k in self.manifest if not isinstance(found, dict) or found.get(k) != self.manifest[k])
            what = ", ".join(differ) if differ else "its format"
            raise ValidationError(f"{self.path} is the checkpoint of another run (it differs in {what}); rerun "
                                  "with the same input and flags to resume it, or pass --no-resume to start over")


def records(path: Path) -> list[tuple[str, int]]:
    """(kind, unit) of each whole record of a checkpoint log, in order: to inspect a run's progress."""
    data, position, found = path.read_bytes(), 0, []
    while position + _HEAD.size <= len(data):
        kind, unit, length, crc = _HEAD.unpack_from(data, position)
        payload = data[position + _HEAD.size:position + _HEAD.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            break
        found.append((kind.decode("ascii", "replace"), unit))
        position += _HEAD.size + length
    return found
