"""A Redis Cluster resharded mid-load (issue 39): the slot of the model's hash tag (its queue, its jobs, their
answers) moves from one master to another by the standard procedure (CLUSTER SETSLOT IMPORTING / MIGRATING,
MIGRATE of the slot's keys a few at a time, CLUSTER SETSLOT NODE on every master) while a Producer submits and a
worker serves. Scripts whose keys are partly moved meet TRYAGAIN (or ASK) and are sent again; every submit is
accepted or fails with a clear error, every accepted request is answered (none lost, none left to lease
recovery), and the worker and producer go on after the move."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import pytest
import redis
import redis.cluster

from embedfleet.common.names import slot_tag
from embedfleet.common.redisclient import connect
from embedfleet.common.errors import EmbedfleetError
from embedfleet import AsyncProducer, Producer
from tests.clusterload import AFTER_FAILOVER, FAILOVER_AFTER, MAX_REQUESTS, WINDOW, Load
from tests.harness import idle_worker, serve
from tests.hashed import HASHED_INFO, MODEL, hashed_model
from tests.rediscluster import LocalCluster
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.serving.pipeline import BatchWorker

KEYS_PER_MIGRATE = 10  # keys per MIGRATE (redis-cli --cluster reshard's --cluster-pipeline default)
MIGRATE_TIMEOUT_MS = 5000
SECONDS_PER_TEXT = 0.01
STEP_SECONDS = 0.2  # at most per step: the whole move stays well inside a claim's lease (6 s; a longer one may requeue)


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path / "cluster", masters=3) as running:
        yield running


def _node_id(port: int) -> str:
    with redis.Redis(port=port, decode_responses=True) as client:
        return client.execute_command("CLUSTER", "MYID")


def migrate_slot(masters: list[int], slot: int, source: int, target: int, between=lambda: None) -> int:
    """Move `slot` from the master on port `source` to the one on `target`, the way `redis-cli --cluster
    reshard` moves each slot, calling `between()` after each MIGRATE; returns how many keys moved."""
    start_move(slot, source, target)
    return end_move(masters, slot, source, target, between)


def start_move(slot: int, source: int, target: int) -> None:
    """The move's first step: `target` IMPORTING `slot`, `source` MIGRATING it (no key moved yet)."""
    with redis.Redis(port=source) as old, redis.Redis(port=target) as new:
        new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
        old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))


def end_move(masters: list[int], slot: int, source: int, target: int, between=lambda: None) -> int:
    """The rest of a move that start_move began: MIGRATE its keys, then SETSLOT NODE on every master."""
    target_id, moved = _node_id(target), 0
    with redis.Redis(port=source) as old:
        while batch := old.execute_command("CLUSTER", "GETKEYSINSLOT", slot, KEYS_PER_MIGRATE):
            old.execute_command("MIGRATE", "127.0.0.1", target, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *batch)
            moved += len(batch)
            between()
    for port in [target, source, *(p for p in masters if p not in (source, target))]:
        with redis.Redis(port=port) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return moved


class Paced:
    """`step()` returns once the load made one more submit or answered one more request (STEP_SECONDS at
    most): the move goes on a few keys per step of the load."""

    def step(self) -> None:
        seen = self.progress()
        deadline = time.monotonic() + STEP_SECONDS
        while self.progress() == seen and time.monotonic() < deadline:
            time.sleep(0.005)

    def progress(self) -> int:
        return len(self.accepted) + len(self.refused) + len(self.answers)


class PacedLoad(Paced, Load):
    """The failover test's load (a Producer's submits and waits), paced."""


class AsyncLoad(Paced, Load):
    """Load's loop through an AsyncProducer: WINDOW requests in flight (submit, then wait), until AFTER_FAILOVER
    more were accepted after `failed_over` (MAX_REQUESTS at most); Load's state, its own run."""

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        async with AsyncProducer(self.url) as producer:
            window, tasks, after = asyncio.Semaphore(WINDOW), [], 0
            for index in range(MAX_REQUESTS):
                await window.acquire()
                tasks.append(asyncio.ensure_future(self._one(producer, index, window)))
                await asyncio.sleep(0)  # (its submit goes out before the next is counted)
                if len(self.accepted) >= FAILOVER_AFTER:
                    self.started.set()
                after += self.failed_over.is_set()
                if after >= AFTER_FAILOVER:
                    break
            self.started.set()
            await asyncio.gather(*tasks)

    async def _one(self, producer: AsyncProducer, index: int, window: asyncio.Semaphore) -> None:
        try:
            try:
                request_id = await producer.submit([f"text {index}"], MODEL)
            except EmbedfleetError as exc:
                self.refused.append(exc)
                return
            self.accepted.append(request_id)
            self.answers[request_id] = (await producer.wait(request_id, timeout=60)).embeddings.shape
        finally:
            window.release()


class EmbedLoad(PacedLoad):
    """A Producer's `embed` (enqueue and first wait in one round trip), one request at a time: an embed that
    returns was accepted and answered (its vectors), one that fails must fail with a clear error."""

    def run(self) -> None:
        with Producer(self.url) as producer:
            after = 0
            for index in range(MAX_REQUESTS):
                try:
                    vectors = producer.embed([f"text {index}"], MODEL, timeout=60)
                except EmbedfleetError as exc:
                    self.refused.append(exc)
                else:
                    self.accepted.append(f"embed {index}")
                    self.answers[f"embed {index}"] = vectors.shape
                if len(self.accepted) >= FAILOVER_AFTER:
                    self.started.set()
                after += self.failed_over.is_set()
                if after >= AFTER_FAILOVER:
                    break
            self.started.set()


@pytest.mark.parametrize("loader", [PacedLoad, AsyncLoad, EmbedLoad], ids=["Producer", "AsyncProducer", "embed"])
def test_the_models_slot_moved_mid_load_loses_no_accepted_request(cluster, caplog, loader):
    tag = slot_tag(MODEL)
    slot = redis.cluster.key_slot(tag.encode())
    connection = connect(cluster.url)
    engine = Engine(hashed_model(SECONDS_PER_TEXT), max_batch_tokens=64, max_batch_size=64)
    info = {**HASHED_INFO, "host": socket.gethostname()}
    load = loader(cluster.url)
    try:
        with serve(engine, connection, info=info, max_jobs=8):
            load.start()
            assert load.started.wait(60), "the load did not start"
            source = connection.get_node_from_key(tag).port
            target = next(p for p in cluster.master_ports() if p != source)
            moved = migrate_slot(cluster.master_ports(), slot, source, target, load.step)
            load.failed_over.set()  # (the Load's name for "the move is done": AFTER_FAILOVER more submits)
            load.join(120)
            assert not load.is_alive(), "the load did not end"
    finally:
        connection.close()
    assert moved > 0
    assert connect(cluster.url).get_node_from_key(tag).port == target
    assert len(load.accepted) >= FAILOVER_AFTER + AFTER_FAILOVER // 2, f"refused: {load.refused[:3]}"
    assert all(refused.code for refused in load.refused)
    assert set(load.answers) == set(load.accepted), "every accepted request is answered"
    assert set(load.answers.values()) == {(1, 8)}
    assert not [r for r in caplog.records if "could not store" in r.getMessage()]
    assert not [r for r in caplog.records if "whose lease lapsed" in r.getMessage()], "none left to lease recovery"


def test_waits_outlast_redis_pys_own_retries_while_their_slot_moves(cluster, caplog):
    """AsyncProducer waits whose results are not there yet, their slot being moved: an MGET of several
    missing keys gets TRYAGAIN there for as long as the move lasts, far past the ~0.4 s redis-py follows it on
    its own. The waits read again until the move ends, and are answered once a worker serves them."""
    caplog.set_level(logging.INFO, logger="embedfleet.producer.client.waiters")
    tag = slot_tag(MODEL)
    slot = redis.cluster.key_slot(tag.encode())
    connection = connect(cluster.url)
    worker = _advertised_worker(connection)  # (served only once the move is over)

    def reads_met_the_move() -> bool:
        return any("slot is being moved" in r.getMessage() for r in caplog.records)

    async def scenario() -> list:
        async with AsyncProducer(cluster.url) as producer:
            request_ids = [await producer.submit([f"text {index}"], MODEL) for index in range(4)]
            source = connection.get_node_from_key(tag).port
            target = next(p for p in cluster.master_ports() if p != source)
            start_move(slot, source, target)
            waits = [asyncio.ensure_future(producer.wait(i, timeout=60)) for i in request_ids]
            deadline = time.monotonic() + 30
            while not reads_met_the_move() and not any(w.done() for w in waits) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not any(w.done() for w in waits), [w.exception() for w in waits if w.done()]
            assert reads_met_the_move(), "the waits' reads never met the move"
            assert end_move(cluster.master_ports(), slot, source, target) > 0
            with serve(worker):
                return [(await wait).embeddings.shape for wait in waits]

    try:
        assert asyncio.run(scenario()) == [(1, 8)] * 4
    finally:
        connection.close()
    assert not [r for r in caplog.records if "died" in r.getMessage()]


def _tryagains(*ports: int) -> int:
    """How many commands the nodes on `ports` refused with TRYAGAIN so far (the source of a move refuses a
    command whose keys it holds only some of; the target one whose keys are not all there yet)."""
    count = 0
    for port in ports:
        with redis.Redis(port=port) as client:
            count += int(client.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0))
    return count


def _advertised_worker(connection) -> BatchWorker:
    """A worker of MODEL on `connection`, advertised (so that producers submit) but not serving yet."""
    return idle_worker(Engine(hashed_model(0), max_batch_tokens=64, max_batch_size=64), connection, max_jobs=8,
                       info={**HASHED_INFO, "host": socket.gethostname()})


def _held_by_a_move(cluster, connection, call, got: list) -> tuple[int, int, threading.Thread]:
    """Start moving MODEL's slot, run `call()` in a thread (what it returns appended to `got`), and return once
    the two nodes refused 24 commands with TRYAGAIN since, past redis-py's own retries (~8 a give-up), asserting
    that `call` still runs. Returns (source, target, the thread); `end_move` ends the move."""
    tag = slot_tag(MODEL)
    source = connection.get_node_from_key(tag).port
    target = next(p for p in cluster.master_ports() if p != source)
    start_move(redis.cluster.key_slot(tag.encode()), source, target)
    before = _tryagains(source, target)
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while thread.is_alive() and _tryagains(source, target) < before + 24 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert thread.is_alive(), f"it ended while the move went on: {got}"
    return source, target, thread


def test_get_many_waits_for_its_slots_move_to_end(cluster):
    """Producer.get_many, its results' slot being moved: its MGET gets TRYAGAIN for as long as the move lasts;
    it sends again until the move ends, then reads (none landed yet: the worker never serves)."""
    connection = connect(cluster.url)
    _advertised_worker(connection)
    got: list = []
    try:
        with Producer(cluster.url) as producer:
            request_ids = [producer.submit([f"text {index}"], MODEL) for index in range(4)]
            source, target, reader = _held_by_a_move(cluster, connection, lambda: producer.get_many(request_ids), got)
            slot = redis.cluster.key_slot(slot_tag(MODEL).encode())
            assert end_move(cluster.master_ports(), slot, source, target) > 0
            reader.join(30)
            assert got == [[None] * 4]
    finally:
        connection.close()


def test_a_sync_wait_outlasts_redis_pys_own_retries_while_its_slot_moves(cluster):
    """Producer.wait, its request's slot being moved before the answer: its first look (EXISTS of the result
    and the job, two keys) gets TRYAGAIN for as long as the move lasts; it sends it again until the move ends,
    then waits as usual and is answered once a worker serves the request."""
    connection = connect(cluster.url)
    worker = _advertised_worker(connection)  # (served only once the move is over)
    got: list = []
    try:
        with Producer(cluster.url) as producer:
            request_id = producer.submit(["text"], MODEL)
            source, target, waiter = _held_by_a_move(
                cluster, connection, lambda: producer.wait(request_id, timeout=60), got)
            slot = redis.cluster.key_slot(slot_tag(MODEL).encode())
            assert end_move(cluster.master_ports(), slot, source, target) > 0
            with serve(worker):
                waiter.join(60)
            assert [result.embeddings.shape for result in got] == [(1, 8)]
    finally:
        connection.close()
