"""A batch's output and error files, written when it ends from the answers collected in Redis."""

from __future__ import annotations

import contextlib

import redis

from embedfleet.producer.gateway.batches import objects
from embedfleet.producer.gateway.batches.store import Store, now


async def write_outputs(store: Store, batch_id: str, meta: dict, total: int, part_bytes: int,
                        default_ttl: int) -> dict[str, str]:
    """The output and error files, written part by part from the collected lines in order (no more than a
    part of each and one read of lines in memory); their ids by field name (only files with lines). The ids
    derive from the batch: a replica that writes them again (the first died meanwhile) writes the same files."""
    writers = {ok: await store.file_writer(objects.output_file_id(batch_id, which), part_bytes).start()
               for ok, which in ((True, "output"), (False, "error"))}
    try:
        async for ok, line in store.lines(batch_id, total):
            await writers[ok].write(line + b"\n")
        files = {}
        ttl = meta.get("output_ttl") or default_ttl
        for ok, which in ((True, "output"), (False, "error")):
            writer = writers.pop(ok)
            if writer.size == 0:
                await store.discard(writer)
                continue
            created = now()
            file_meta = {"id": objects.output_file_id(batch_id, which), "created_at": created,
                         "filename": f"{batch_id}_{which}.jsonl", "purpose": "batch_output",
                         "expires_at": created + ttl, **({"owner": meta["owner"]} if meta.get("owner") else {})}
            await store.commit_file(file_meta, writer, ttl)
            files[f"{which}_file_id"] = file_meta["id"]
        return files
    finally:
        for writer in writers.values():  # a failed write leaves no staging key behind for long
            with contextlib.suppress(redis.RedisError, OSError):
                await store.discard(writer)
