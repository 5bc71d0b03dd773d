"""Reading a bulk input file into units of work: chunks of texts, or the requests of an OpenAI batch file.

Text inputs give (id, text) records, cut into chunks of `--chunk` texts (one request each):
    .txt      one text per line (blank lines skipped); id: the text's position among those embedded
    .json     a list of texts, or a list of objects whose `--field` holds the text
    .jsonl    one JSON text, or one object with `--field`, per line
    .csv      a header row; `--column` holds the text
    .parquet  `--column` holds the text
An id column/field (`--id-column`, default `id` where the input has one) gives each text its id; otherwise
the id is the text's position (0-based) among the texts embedded. A .jsonl whose first line is an object
with `custom_id` and `body` is an OpenAI batch file (vLLM's run-batch format): each line is one request.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.common.errors import EmbedfleetError, ValidationError
from embedfleet.common.request import normalize_inputs

TEXT_FORMATS = (".txt", ".json", ".jsonl", ".csv", ".parquet")
DEFAULT_COLUMN = "text"
DEFAULT_ID_COLUMN = "id"
BATCH_URL = "/v1/embeddings"
# Body fields of a batch line that become request fields; `input`, `model`, `encoding_format` and `user`
# are read apart, anything else is refused on that line (as OpenAI's API refuses an unknown parameter).
BATCH_FIELDS = ("dimensions", "truncate_prompt_tokens", "use_activation", "normalize", "embed_dtype", "endianness")


@dataclass
class Record:
    where: str  # FILE:LINE or FILE row N, for error messages
    id: str | int
    text: str


@dataclass
class Unit:
    """One request of the run: its inputs, and for a batch line its own model, fields and custom_id."""

    index: int
    inputs: list
    where: list[str]
    fields: dict = field(default_factory=dict)
    model: str | None = None
    custom_id: str | None = None
    encoding_format: str = "float"
    error: EmbedfleetError | None = None  # a batch line refused before submit: answered as an error line


@dataclass
class Source:
    """What the input holds: text records (then `ids` names them) or batch requests."""

    units: list[Unit]
    ids: list[str | int] | None  # None for a batch file
    texts: int

    @property
    def is_batch(self) -> bool:
        return self.ids is None


def read_source(path: Path, *, chunk: int, column: str | None = None, id_column: str | None = None) -> Source:
    """The units of `path`; a bad file, field or column raises ValidationError naming where and what."""
    suffix = path.suffix.lower()
    if suffix not in TEXT_FORMATS:
        raise ValidationError(f"{path}: unknown input format {path.suffix or '(no suffix)'!r}; the input must be "
                              f"one of {', '.join(TEXT_FORMATS)}")
    if suffix == ".jsonl" and _is_batch_file(path):
        return _read_batch(path)
    if suffix == ".txt":
        texts = [(f"{path}:{n}", line) for n, line in enumerate(_text(path).splitlines(), 1) if line.strip()]
        records = [Record(where, i, text) for i, (where, text) in enumerate(texts)]
    elif suffix == ".csv":
        records = _read_csv(path, column or DEFAULT_COLUMN, id_column)
    elif suffix == ".parquet":
        records = _read_parquet(path, column or DEFAULT_COLUMN, id_column)
    else:
        records = _read_json(path, suffix, column, id_column)
    if not records:
        raise ValidationError(f"{path}: no texts to embed; put one text per line")
    units = [Unit(i, [r.text for r in records[start:start + chunk]], [r.where for r in records[start:start + chunk]])
             for i, start in enumerate(range(0, len(records), chunk))]
    return Source(units, [r.id for r in records], len(records))


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


# -- JSON and JSON lines ---------------------------------------------------------------------------------

def _read_json(path: Path, suffix: str, column: str | None, id_column: str | None) -> list[Record]:
    raw = _text(path)
    if suffix == ".json":
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); a .json file holds one "
                                  "list of texts, or of objects with a text field (--field)") from None
        if not isinstance(items, list):
            raise ValidationError(f"{path}: expected a JSON list of texts or objects, got a "
                                  f"{type(items).__name__}; use .txt for one text per line")
        located = [(f"{path} item {i}", item) for i, item in enumerate(items)]
    else:
        located = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    located.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValidationError(f"{path}:{n}: not valid JSON ({exc.msg}); each line of a .jsonl "
                                          "file holds one JSON text, like \"a text\", or one object") from None
    ids_given = id_column or (DEFAULT_ID_COLUMN if any(isinstance(item, dict) and DEFAULT_ID_COLUMN in item
                                                      for _, item in located[:1]) else None)
    records = []
    for i, (where, item) in enumerate(located):
        if isinstance(item, str) and column is None and id_column is None:
            records.append(Record(where, i, item))
        elif isinstance(item, dict):
            name = column or DEFAULT_COLUMN
            text = _field(where, item, name, "--field")
            records.append(Record(where, _id(where, item, ids_given) if ids_given else i, text))
        else:
            what = "an object with the fields --field and --id-column name" if column or id_column else \
                "a JSON text, or an object with a `text` field (another: --field NAME)"
            raise ValidationError(f"{where}: got a {type(item).__name__}; expected {what}")
    return records


def _field(where: str, row: dict, name: str, flag: str) -> str:
    if name not in row:
        fields = ", ".join(sorted(map(str, row))) or "none"
        raise ValidationError(f"{where}: no field {name!r}; its fields are {fields}; name the text's with {flag} NAME")
    if not isinstance(row[name], str):
        raise ValidationError(f"{where}: field {name!r} holds a {type(row[name]).__name__}, not a text")
    return row[name]


def _id(where: str, row: dict, name: str) -> str | int:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        what = "missing" if value is None else f"a {type(value).__name__}"
        raise ValidationError(f"{where}: id field {name!r} is {what}; every row needs a text or integer id "
                              "(or drop --id-column to number the rows)")
    return value


# -- tables ----------------------------------------------------------------------------------------------

def _read_csv(path: Path, column: str, id_column: str | None) -> list[Record]:
    with path.open(newline="", encoding="utf-8") as handle:
        try:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            ids = _id_column(path, header, id_column)
            _has_column(path, header, column, "--column")
            records = []
            for i, row in enumerate(reader):
                where = f"{path}:{reader.line_num}"
                if row.get(column) is None:
                    raise ValidationError(f"{where}: the row is shorter than the header; it has no {column!r}")
                records.append(Record(where, row[ids] if ids else i, row[column]))
        except UnicodeDecodeError as exc:
            raise ValidationError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        except csv.Error as exc:
            raise ValidationError(f"{path}: not a readable CSV file ({exc})") from None
    return records


def _read_parquet(path: Path, column: str, id_column: str | None) -> list[Record]:
    import pyarrow as pa  # noqa: PLC0415 - only parquet needs pyarrow (the [cli] extra)
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        schema = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise ValidationError(f"{path}: not a readable Parquet file ({exc})") from None
    ids = _id_column(path, schema.names, id_column)
    _has_column(path, schema.names, column, "--column")
    if not pa.types.is_string(schema.field(column).type) and not pa.types.is_large_string(schema.field(column).type):
        raise ValidationError(f"{path}: column {column!r} holds {schema.field(column).type}, not text; name the "
                              "text column with --column NAME")
    table = pq.read_table(path, columns=[column, *([ids] if ids and ids != column else [])])
    texts = table.column(column).to_pylist()
    keys = table.column(ids).to_pylist() if ids else list(range(len(texts)))
    records = []
    for i, (key, text) in enumerate(zip(keys, texts)):
        if text is None or key is None:
            raise ValidationError(f"{path} row {i}: {'the text' if text is None else 'the id'} is null; every row "
                                  "needs both")
        records.append(Record(f"{path} row {i}", key if isinstance(key, (int, str)) else str(key), text))
    return records


def _id_column(path: Path, names: list[str], id_column: str | None) -> str | None:
    if id_column is not None:
        _has_column(path, names, id_column, "--id-column")
        return id_column
    return DEFAULT_ID_COLUMN if DEFAULT_ID_COLUMN in names else None


def _has_column(path: Path, names: list[str], column: str, flag: str) -> None:
    if column not in names:
        raise ValidationError(f"{path}: no column {column!r}; its columns are {', '.join(names) or 'none'}; "
                              f"name the right one with {flag} NAME")


# -- OpenAI batch files ----------------------------------------------------------------------------------

def _is_batch_file(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(first, dict) and "custom_id" in first and "body" in first
    return False


def _read_batch(path: Path) -> Source:
    units, seen = [], set()
    for n, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{where}: not valid JSON ({exc.msg}); each line of a batch file is one "
                                  "request object with custom_id, method, url and body") from None
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str) or \
                not isinstance(item.get("body"), dict):
            raise ValidationError(f"{where}: expected an object with a text `custom_id` and an object `body`, "
                                  "like OpenAI's batch input")
        if item["custom_id"] in seen:
            raise ValidationError(f"{where}: custom_id {item['custom_id']!r} is used twice; each request needs "
                                  "its own")
        seen.add(item["custom_id"])
        units.append(_batch_unit(len(units), where, item))
    if not units:
        raise ValidationError(f"{path}: no requests in the batch file")
    return Source(units, None, sum(len(u.inputs) for u in units))


def _batch_unit(index: int, where: str, item: dict) -> Unit:
    body = item["body"]
    unit = Unit(index, [""], [where], custom_id=item["custom_id"])
    try:
        if item.get("url", BATCH_URL) != BATCH_URL or item.get("method", "POST") != "POST":
            raise ValidationError(f"{item.get('method')} {item.get('url')} is not served here; embedfleet "
                                  f"embeds POST {BATCH_URL} requests only", param="url")
        unknown = sorted(set(body) - {"input", "model", "encoding_format", "user", *BATCH_FIELDS})
        if unknown:
            raise ValidationError(f"unknown body field(s) {', '.join(unknown)}; allowed are input, model, "
                                  f"encoding_format, user, {', '.join(BATCH_FIELDS)}", param=unknown[0])
        if body.get("encoding_format", "float") not in ("float", "base64"):
            raise ValidationError("encoding_format must be float or base64", param="encoding_format")
        if "model" in body and not isinstance(body["model"], str):
            raise ValidationError("model must be a text", param="model")
        unit.inputs = normalize_inputs(body.get("input"))
        unit.where = [where] * len(unit.inputs)
    except ValidationError as exc:
        unit.error = exc
    unit.model = body.get("model") if isinstance(body.get("model"), str) else None
    unit.fields = {k: body[k] for k in BATCH_FIELDS if k in body}
    unit.encoding_format = body.get("encoding_format", "float") if unit.error is None else "float"
    return unit
