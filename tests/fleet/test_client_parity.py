"""Producer and AsyncProducer give the same answers, statuses and errors: one table of scenarios, each run
through both clients against a real redis-server and real BatchWorkers (the null model; a tiny BERT whose
long inputs are spread over the fleet), compared field by field, ids aside.

Each scenario runs on a freshly flushed Redis with a fresh fleet, once per client: what one client left
behind cannot change what the other sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import EmbedfleetError
from embedfleet.common.protocol import rqkeys
from embedfleet.common.request import new_request_id
from embedfleet.common.result import Result
from embedfleet import AsyncProducer, Producer
from embedfleet.producer.client.fleet import LevelStats
from tests.harness import burst, idle_worker, one_round, serve, worker
from tests.longinputs import MAX_LEN, words
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

LONG_TEXT = words(7 * MAX_LEN, seed=3)  # 8 chunks of the tiny BERT: 4 parts, spread over the fleet
BAD_ID = "not an id!"  # no request of ours has such an id


# -- the fleet and the two clients ---------------------------------------------------------------------

@contextlib.contextmanager
def parity_fleet(redis_client, long):
    """`null` serving in a thread; `idle` (the null model too) and `long` (the tiny BERT, parts of 2 chunks)
    advertised, run by hand: their queues hold what a scenario puts there until it runs them. `parts` is a
    second worker of `long`, for the parts of a request that `long` spread over the fleet."""
    redis_client.flushall()
    idle = idle_worker(Engine(NullModel("null:4", served_name="idle")), redis_client, name="parity-idle")
    long_worker = idle_worker(Engine(long), redis_client, max_jobs=1, name="parity-long", chunks_per_job=2)
    parts = worker(Engine(long), redis_client, max_jobs=1, name="parity-parts", chunks_per_job=2)
    with serve(Engine(NullModel("null:4", served_name="null")), redis_client, name="parity-null") as null:
        yield SimpleNamespace(null=null, idle=idle, long=long_worker, parts=parts, redis=redis_client)


class Face:
    """One client, called the same way whichever it is: a call returns its value, or the embedfleet error
    it raised (errors are answers too). The async client runs on an event loop of this thread."""

    def __init__(self, kind: str, redis_url: str, options: dict):
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self.producer = self._done(_open_async(redis_url, options)) if self.loop else Producer(redis_url, **options)
        self.ids: list[str] = []  # in the order the scenario made them: the same order for both clients

    def __call__(self, method: str, *args, **kwargs):
        try:
            value = self._done(getattr(self.producer, method)(*args, **kwargs))
        except EmbedfleetError as err:
            return err
        self.ids += [value] if method == "submit" else value if method == "submit_many" else []
        return value

    def new_id(self) -> str:
        request_id = new_request_id()
        self.ids.append(request_id)
        return request_id

    def close(self) -> None:
        self._done(self.producer.close())
        if self.loop:
            self.loop.close()

    def _done(self, value):
        return self.loop.run_until_complete(value) if self.loop and inspect.isawaitable(value) else value


async def _open_async(redis_url: str, options: dict) -> AsyncProducer:
    return AsyncProducer(redis_url, **options)


# -- the scenarios ---------------------------------------------------------------------------------------

def served(face: Face, fleet) -> dict:
    request_id = face("submit", ["hello", "world"], "null", dimensions=2)
    return {"wait": face("wait", request_id, 30), "wait again": face("wait", request_id, 30),
            "get": face("get", request_id), "status": face("status", request_id),
            "cancel done": face("cancel", request_id)}


def unknown_model(face: Face, fleet) -> dict:
    return {"submit": face("submit", "hello", "nope"), "embed": face("embed", "hello", "nope")}


def invalid(face: Face, fleet) -> dict:
    return {"dimensions": face("submit", "hello", "null", dimensions=999),
            "no input": face("submit", [], "null"), "pooling field": face("submit", "hello", "null", bogus=1)}


def queue_full(face: Face, fleet) -> dict:
    return {"first": face("submit", "a", "idle"), "second": face("submit", "b", "idle"),
            "depth": face("queue_depth", "idle")}


def never_submitted(face: Face, fleet) -> dict:
    request_id = face.new_id()
    return {"wait": face("wait", request_id, 30), "wait bad id": face("wait", BAD_ID, 30),
            "get": face("get", request_id), "status": face("status", request_id),
            "status bad id": face("status", BAD_ID), "cancel": face("cancel", request_id),
            "cancel bad id": face("cancel", BAD_ID)}


def cancel_queued(face: Face, fleet) -> dict:
    request_id = face("submit", "a", "idle")
    return {"queued": face("status", request_id), "cancel": face("cancel", request_id),
            "cancel again": face("cancel", request_id), "status": face("status", request_id),
            "wait": face("wait", request_id, 30), "get": face("get", request_id)}


def started_then_finished(face: Face, fleet) -> dict:
    request_id = face("submit", "a", "idle")
    queued = face("status", request_id)
    batch = fleet.idle.take_round(None)  # taken: the job is started, its result still to come
    started, cancel = face("status", request_id), face("cancel", request_id)
    fleet.idle.engine.forward(batch.work)
    fleet.idle.finish_round(batch)
    return {"queued": queued, "started": started, "cancel started": cancel, "finished": face("status", request_id),
            "wait": face("wait", request_id, 30)}


def failed(face: Face, fleet) -> dict:
    request_id = face("submit", "a", "idle")
    fleet.redis.hset(rqkeys.rq_job_key(request_id), "data", b"not rq job data")  # what no producer writes
    burst(fleet.idle)  # answers it failed, never run
    return {"status": face("status", request_id), "wait": face("wait", request_id, 30),
            "get": face("get", request_id)}


def spread(face: Face, fleet) -> dict:
    request_id = face("submit", [LONG_TEXT], "long")
    one_round(fleet.long)  # tokenised and spread: its job is finished, its parts queued
    parts_run = face("status", request_id)
    burst(fleet.parts)  # the parts; the last one's join answers the request
    return {"parts run": parts_run, "wait": face("wait", request_id, 30), "status": face("status", request_id)}


def every_field(face: Face, fleet) -> dict:
    """Every request field through every method that submits (issue 50: the sync embed lost `priority` and
    `deadline` and refused them as "not a request field")."""
    fields = {"priority": "bulk", "deadline": time.time() + 600, "dimensions": 2, "embed_dtype": "float16",
              "truncate_prompt_tokens": -1, "cache": False}
    request_id = face("submit", ["a", "b"], "null", **fields)
    many = face("submit_many", [["c"], ["d", "e"]], "null", **fields)
    return {"submit": face("wait", request_id, 30), "submit_many 1": face("wait", many[0], 30),
            "submit_many 2": face("wait", many[1], 30), "embed": face("embed", ["f", "g"], "null", **fields).shape,
            "embed at interactive": face("embed", "h", "null", priority="interactive").shape,
            "encode": face("encode", ["i"], "null", outputs=["dense"], **fields).dense.shape,
            "bad priority": face("embed", "j", "null", priority="urgent"), **other_tasks(face, fields)}


TASKS = {"score": ("k", ["l", "m"]), "rerank": ("k", ["l", "m"]), "classify": (["n"],), "token_embed": (["o"],),
         "sparse_embed": (["p"],), "tokenize": (["q"],), "detokenize": ([[1, 2]],)}


def other_tasks(face: Face, fields: dict) -> dict:
    """The other task methods with every field: the null model answers none of them, so each is refused for its
    task, never for a field it dropped or did not take."""
    refused = {name: face(name, *args, "null", **fields) for name, args in TASKS.items()}
    return {**refused, "tasks refused for": sorted({getattr(err, "param", repr(err)) for err in refused.values()})}


def one_sided_once(face: Face, fleet) -> dict:
    """What only one client had before issue 50 (Producer: check, get_many, url_for_submit, connection_for_model,
    raise_if_unknown; AsyncProducer: urls, connection_at), now in both."""
    request_id = face("submit", ["a"], "null")
    face("wait", request_id, 30)
    never = face.new_id()
    url = face("urls")[0]
    pings = [face._done(connection.ping()) for connection in (face("connection_at", url), face(
        "connection_for_model", "null"), face("connection_of", request_id))]
    many = face("get_many", [request_id, never, BAD_ID])
    return {"check": face("check"), "urls": len(face("urls")), "get_many": many,
            "get_many found": [result is not None for result in many],
            "url for submit": face("url_for_submit", "null") == url, "url for any": face("url_for_submit", None) == url,
            "pings": pings, "known": face("raise_if_unknown", request_id), "unknown": face("raise_if_unknown", never),
            "bad id": face("raise_if_unknown", BAD_ID)}


def fleet_reads(face: Face, fleet) -> dict:
    face("submit_many", [["a"], ["b", "c"]], "idle")
    face("submit_many", [["d"]], "idle", priority="bulk")
    return {"models": face("models"), "known": face("known_models"), "live null": face("live_workers", "null"),
            "live nope": face("live_workers", "nope"), "workers": face("workers", "null"),
            "level stats": face("level_stats", "idle"), "depth": face("queue_depth", "idle"),
            "fleet": face("fleet")}


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    steps: Callable[[Face, object], dict]
    expect: dict  # observation -> brief(observation), for both clients
    options: dict = dataclasses.field(default_factory=dict)  # the clients' keyword arguments


TABLE = [
    Row("served", served, {"wait": "result (2, 2)", "wait again": "result (2, 2)", "get": "result (2, 2)",
                           "status": "finished", "cancel done": False}),
    Row("unknown model", unknown_model, {"submit": "raises model_not_found", "embed": "raises model_not_found"}),
    Row("validation", invalid, {"dimensions": "raises invalid_request", "no input": "raises invalid_request",
                                "pooling field": "raises invalid_request"}),
    Row("queue full", queue_full, {"second": "raises queue_full", "depth": 1}, {"max_queue_depth": 1}),
    Row("never submitted", never_submitted, {
        "wait": "raises not_found", "wait bad id": "raises not_found", "get": None, "status": "not_found",
        "status bad id": "not_found", "cancel": "raises not_found", "cancel bad id": "raises not_found"}),
    Row("cancel queued", cancel_queued, {"queued": "queued", "cancel": True, "cancel again": False,
                                         "status": "cancelled", "wait": "raises cancelled",
                                         "get": "result !cancelled"}),
    Row("started, finished", started_then_finished, {"queued": "queued", "started": "started",
                                                     "cancel started": False, "finished": "finished",
                                                     "wait": "result (1, 4)"}),
    Row("failed", failed, {"status": "failed", "wait": "raises decode_error", "get": "result !decode_error"}),
    Row("spread, parts running", spread, {"parts run": "started", "wait": "result (1, 32)", "status": "finished"}),
    Row("every field, every submit", every_field, {
        "submit": "result (2, 2)", "submit_many 1": "result (1, 2)", "submit_many 2": "result (2, 2)", "embed": (2, 2),
        "embed at interactive": (1, 4), "encode": (1, 2), "bad priority": "raises invalid_request",
        **{name: "raises invalid_request" for name in TASKS}, "tasks refused for": ["task"]}),
    Row("what one client had", one_sided_once, {
        "check": [], "urls": 1, "get_many found": [True, False, False], "url for submit": True, "url for any": True,
        "pings": [True, True, True], "known": None, "unknown": "raises not_found", "bad id": "raises not_found"}),
    Row("fleet reads", fleet_reads, {"known": {"idle", "long", "null"}, "live null": 1, "live nope": 0, "depth": 2}),
]


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_both_clients_answer_alike(row, redis_url, redis_client, long_model):
    seen = {}
    for kind in ("sync", "async"):
        with parity_fleet(redis_client, long_model[1]) as workers:
            face = Face(kind, redis_url, row.options)
            try:
                seen[kind] = normal(row.steps(face, workers), face.ids)
            finally:
                face.close()
    assert_same(seen["sync"], seen["async"], row.name)
    assert {name: brief(seen["sync"][name]) for name in row.expect} == row.expect


def test_the_table_covers_every_stage_of_a_request():
    """A guard on the table itself: each status a client reports appears in some row's expectations."""
    shown = {value for row in TABLE for value in row.expect.values() if isinstance(value, str)}
    assert {"queued", "started", "finished", "failed", "cancelled", "not_found"} <= shown


# -- observations, ids aside -------------------------------------------------------------------------

WORKER_CLOCK = ("started_at", "last_beat_s")  # what a worker's advert says of the clock


def normal(value, ids: list[str]):
    """`value` with each request id replaced by its place in `ids`, and what moves with the clock dropped."""
    def scrub(text: str) -> str:
        for index, request_id in enumerate(ids):
            text = text.replace(request_id, f"<id{index}>")
        return text

    if isinstance(value, EmbedfleetError):
        return {"raises": type(value).__name__, "code": value.code, "message": scrub(value.message),
                "param": value.param}
    if isinstance(value, Result):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                  if f.name not in ("id", "data", "finished_at")}
        rows = value.embeddings if value.ok and value.task == "embed" else None
        return {"result": scrub(value.id), **normal(fields, ids), "embeddings": rows}
    if isinstance(value, ModelCapabilities):
        return value.model_dump(mode="json")
    if isinstance(value, LevelStats):
        return {**dataclasses.asdict(value), "oldest_age": value.oldest_age is not None}
    if isinstance(value, dict) and "workers" in value and "time" in value:  # the fleet snapshot
        return normal({key: item for key, item in value.items() if key != "time"}, ids)
    if isinstance(value, dict) and "oldest_age_s" in value:  # a queue row of the snapshot
        return {**value, "oldest_age_s": value["oldest_age_s"] is not None}
    if isinstance(value, dict) and "started_at" in value:  # a worker's advert
        return {key: item for key, item in value.items() if key not in WORKER_CLOCK}
    if isinstance(value, dict):
        return {key: normal(item, ids) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(normal(item, ids) for item in value)
    if isinstance(value, str):
        return scrub(value)
    return value


def assert_same(sync, aio, where: str) -> None:
    """Equal, field by field; vectors within float32 rounding."""
    if isinstance(sync, np.ndarray) or isinstance(aio, np.ndarray):
        assert isinstance(sync, np.ndarray) and isinstance(aio, np.ndarray), where
        assert sync.shape == aio.shape and sync.dtype == aio.dtype, where
        assert np.allclose(sync, aio, rtol=0, atol=1e-6), where
    elif isinstance(sync, dict) and isinstance(aio, dict):
        assert sync.keys() == aio.keys(), where
        for key in sync:
            assert_same(sync[key], aio[key], f"{where} / {key}")
    elif isinstance(sync, (list, tuple)) and isinstance(aio, (list, tuple)):
        assert len(sync) == len(aio), where
        for index, (one, other) in enumerate(zip(sync, aio)):
            assert_same(one, other, f"{where} / {index}")
    else:
        assert sync == aio, f"{where}: Producer {sync!r}, AsyncProducer {aio!r}"


def brief(seen):
    """What the table expects of an observation: an error by its code, a result by its shape or error."""
    if isinstance(seen, dict) and "raises" in seen:
        return f"raises {seen['code']}"
    if isinstance(seen, dict) and "result" in seen:
        return f"result {tuple(seen['shape'])}" if seen["status"] == "ok" else f"result !{seen['error_code']}"
    return seen
