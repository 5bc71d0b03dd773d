"""`embedfleet embed INPUT OUTPUT`: a file of texts (or an OpenAI batch file) through the fleet, resumable."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

from embedfleet.common.config import Settings

DOC = """Embed INPUT into OUTPUT, in input order.

INPUT: .txt (a text a line; blank lines skipped), .json (a list of texts, or of objects: --field), .jsonl
(a JSON text or an object a line: --field), .csv or .parquet (--column; an id column, --id-column or `id`,
is kept), or an OpenAI batch file (.jsonl lines with custom_id and body, as vLLM's run-batch reads).
OUTPUT: .npy (the vectors), .parquet (id + embedding), .jsonl ({"id", "embedding"} a line); a batch file
gives an OpenAI batch output (.jsonl). With --sparse (a SPLADE or bge-m3 model): .parquet (id, token_ids,
weights) or .jsonl ({"id", "token_ids", "weights"} a line).

At most --window requests of --chunk texts are queued at a time, at priority --priority. Progress is
logged to OUTPUT.embedfleet-checkpoint: after Ctrl-C or a crash, the same command resumes where it stopped
and writes the same bytes as an uninterrupted run. OUTPUT appears only when every text is embedded; if a
line fails, each failing line is named and OUTPUT is not written. An existing OUTPUT is replaced only with
--overwrite (or by the resumed run that was started with it), and only once the new one is whole."""


class EmbedFileSettings(Settings):
    model: str | None = Field(None, description="served model name; default: the only one served")
    chunk: int = Field(64, ge=1, description="texts per request")
    window: int = Field(16, ge=1, description="most requests of this run in the queue at once")
    priority: str = Field("bulk", description="the requests' priority (interactive or bulk), where the fleet "
                                              "has priorities")
    timeout: float = Field(600.0, gt=0, description="seconds to wait for each request's result")
    embed_dtype: str = Field("float32", description="output dtype (see PoolingParams)")
    dimensions: int | None = Field(None, description="Matryoshka dimensions")
    truncate_prompt_tokens: int | None = Field(None, description="-1: truncate each text to the model's max "
                                                                 "length; default: a too-long line fails")
    field: str | None = Field(None, description="the field of .json/.jsonl objects that holds the text "
                                                "(default: text)")
    column: str | None = Field(None, description="the .csv/.parquet column that holds the text (default: text)")
    id_column: str | None = Field(None, description="the column or field of ids kept in the output (default: "
                                                    "`id` where the input has one, else the row's position)")
    sparse: bool = Field(False, description="write sparse vectors (task sparse_embed: a SPLADE or bge-m3 model) as "
                                            "token_ids + weights, to .parquet or .jsonl")
    sparse_top_k: int | None = Field(None, description="with --sparse: keep each text's k largest weights")
    sparse_threshold: float | None = Field(None, description="with --sparse: keep weights above this only")
    resume: bool = Field(True, description="resume from OUTPUT's checkpoint when there is one (--no-resume: "
                                           "start over)")
    overwrite: bool = Field(False, description="replace OUTPUT if it exists (else such a run is refused, unless "
                                               "it resumes its own checkpoint)")
    progress: bool | None = Field(None, description="show a progress bar (default: when stderr is a terminal)")


def main(argv: list[str]) -> int:
    parser = EmbedFileSettings.parser("embedfleet embed", DOC)
    parser.add_argument("input", type=Path, help="file of texts or batch requests")
    parser.add_argument("output", type=Path, help="where to write the vectors (.npy, .parquet, .jsonl)")
    values = vars(parser.parse_args(argv))
    source_path, target = values.pop("input"), values.pop("output")
    settings = EmbedFileSettings.from_values(parser, values)
    from embedfleet.producer.cli.bulk import checkpoint, runner, sinks, sources  # noqa: PLC0415 - rq and friends load after the flags

    # before the input is read or Redis asked: a refused run costs nothing and leaves OUTPUT as it was
    sinks.check_replace(target, source_path, settings.overwrite,
                        resuming=settings.resume and checkpoint.checkpoint_path(target).exists())
    column = settings.column or settings.field
    source = sources.read_source(source_path, chunk=settings.chunk, column=column, id_column=settings.id_column)
    sinks.check_output(target, source.is_batch)
    fields = {k: v for k, v in {"embed_dtype": settings.embed_dtype, "dimensions": settings.dimensions,
                                "truncate_prompt_tokens": settings.truncate_prompt_tokens,
                                "sparse_top_k": settings.sparse_top_k,
                                "sparse_threshold": settings.sparse_threshold}.items() if v is not None}
    if settings.sparse:
        if source.is_batch:
            raise sinks.ValidationError("--sparse embeds a file of texts, not an OpenAI batch file")
        sinks.check_sparse_output(target)
        fields = {**fields, "task": "sparse_embed"}
        fields.pop("embed_dtype", None)  # sparse weights are float32
    fingerprinted = {"input_format": source_path.suffix.lower(), "output_format": target.suffix.lower(),
                     "chunk": settings.chunk, "column": column, "id_column": settings.id_column,
                     "fields": {} if source.is_batch else fields}
    plan = runner.Plan(source_path, target, source, settings.model, fields, settings.window, settings.timeout,
                       settings.priority, settings.resume,
                       sys.stderr.isatty() if settings.progress is None else settings.progress,
                       {"redis_url": settings.redis_url, "shards": settings.shards.shards, **fingerprinted})
    return runner.run(plan)
