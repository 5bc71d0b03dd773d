"""Hostile entries against every script that reads jobs (take, finish, recover, cancel, join): for every field
and key a script reads, a wrong type or value in ONE job leaves every other job of the same round answered
and in its place, and the bad one ends in a queue or a registry, failed with a reason where it cannot run.
Run under hypothesis over field names and values, against a real redis-server, through the protocol's own
operations (common/protocol/: claims, enqueueing, answering) - the same calls the worker and the clients make.

(Everything a producer with the documented ACL rights (docs/security.md) can write is fair game: job hashes,
notify lists, reply streams, result keys, a gateway job's options, the queued-tokens counter.)
"""

from __future__ import annotations

import re
import uuid
import zlib

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedfleet.common.errors import DecodeError
from embedfleet.common.protocol import answering, enqueueing, keys, rqkeys
from embedfleet.common.protocol.claims import RqSchema, take_from
from embedfleet.common.protocol.records import RQ_RECORDS, Answer, Kind, Outcome
from embedfleet.common.request import EmbedRequest, PartOf
from embedfleet.common.result import Result

ROUND = 6  # jobs per round; the victim is one of them
EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Values a hand-edited hash may hold: empty, huge, negative, fractional, not numbers, not text.
VALUES = st.one_of(
    st.sampled_from(["", "-1", "0", "1", "2.5", "-5", "1e309", "nan", "inf", "-inf", "9" * 30, "0x10", " 3",
                     "started", "canceled", "finished", "failed", "queued", "bogus", "this.s"]),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70).map(str),
    st.text(max_size=12),
    st.binary(max_size=12),
)
TYPES = ("string", "list", "set", "zset", "hash", "stream")
RECORDS = st.sampled_from(RQ_RECORDS)  # each example runs the scripts as a lean or a full worker would


def lua_integer(value: str | bytes) -> bool:
    """What lib.lua's `integer` accepts: an optional minus and ASCII digits, at most 15 characters."""
    raw = value if isinstance(value, bytes) else value.encode()
    return re.fullmatch(rb"-?[0-9]+", raw) is not None and len(raw) <= 15


def plant(conn, key: str, kind: str) -> None:
    """Replace `key` with a value of type `kind`."""
    conn.delete(key)
    {"string": lambda: conn.set(key, "planted"), "list": lambda: conn.rpush(key, "planted"),
     "set": lambda: conn.sadd(key, "planted"), "zset": lambda: conn.zadd(key, {"planted": 1}),
     "hash": lambda: conn.hset(key, "planted", "1"), "stream": lambda: conn.xadd(key, {"planted": "1"})}[kind]()


class Round:
    """ROUND requests of a model of its own (no flush between examples), enqueued as the Producer does, taken
    and finished by a worker that writes `records` of rq's bookkeeping (--rq-records)."""

    def __init__(self, conn, records: str = "lean"):
        self.conn = conn
        self.records = records
        self.reply = None  # the reply stream the round's requests wake on, if any (else their notify lists)
        self.model = f"hostile-{uuid.uuid4().hex[:10]}"
        self.queue = keys.queue_name(self.model)
        self.requests = [EmbedRequest(model=self.model, inputs=[f"text {i}"]) for i in range(ROUND)]
        self.ids = [r.id for r in self.requests]
        self.victim = self.ids[ROUND // 2]
        self.others = [i for i in self.ids if i != self.victim]
        enqueueing.enqueue(conn, enqueueing.enqueue_args(self.queue, self.requests))
        self.schema = RqSchema(conn, self.queue, f"worker-{self.model}", result_ttl=600, lease=30, records=records)

    def take(self):
        suspended, taken = take_from([self.schema], ROUND + 5, None)
        assert not suspended
        return {t.id: t for t in taken}

    def answers(self, taken: dict, outcome=lambda job_id: Outcome.FINISHED) -> list[Answer]:
        """What the worker writes: served rows for runnable jobs, the reason for a bad one (answers.corrupt)."""
        out = []
        for job in taken.values():
            if job.kind is Kind.BAD:
                error = Result.failure(job.id, self.model, DecodeError(job.reason, b""))
                out.append(Answer(job, Outcome.FAILED, error.encode(), reason=job.reason, code="decode_error"))
            elif job.kind is Kind.STARTED:
                blob = Result.success(job.id, self.model, np.ones((1, 4), np.float32), "float32", "little", 2).encode()
                how = outcome(job.id)
                out.append(Answer(job, how, blob,
                                  reason="" if how is Outcome.FINISHED else "machine trouble"))
        return out

    def place_of(self, job_id: str) -> set[str]:
        """Where the id is: queued, claimed, finished, failed, canceled (a registry or the queue)."""
        places = set()
        queue, wip = rqkeys.rq_queue_key(self.queue), rqkeys.rq_wip_key(self.queue)
        if self.conn.type(queue) == b"list" and job_id.encode() in self.conn.lrange(queue, 0, -1):
            places.add("queued")
        if self.conn.type(wip) == b"zset" and any(m.decode().startswith(job_id + ":")
                                                   for m in self.conn.zrange(wip, 0, -1)):
            places.add("claimed")
        for name, key in (("finished", rqkeys.rq_finished_key(self.queue)),
                          ("failed", rqkeys.rq_failed_key(self.queue)),
                          ("canceled", rqkeys.rq_canceled_key(self.queue))):
            if self.conn.type(key) == b"zset" and self.conn.zscore(key, job_id) is not None:
                places.add(name)
        return places

    def answered(self, job_id: str) -> Result:
        raw = self.conn.get(keys.result_key(job_id))
        assert raw is not None, f"request {job_id} has no answer"
        return Result.decode(raw)

    def served(self, job_id: str) -> bool:
        """Answered and ended as served: in rq's finished registry with its status (full), or its job hash
        gone, its answer its record (lean)."""
        if not self.answered(job_id).ok:
            return False
        if self.records == "full":
            return self.place_of(job_id) == {"finished"} and \
                self.conn.hget(rqkeys.rq_job_key(job_id), "status") == b"finished"
        return self.place_of(job_id) == set() and not self.conn.exists(rqkeys.rq_job_key(job_id))

    def assert_others_served(self) -> None:
        for job_id in self.others:
            assert self.served(job_id), (self.records, self.place_of(job_id))
            if self.reply is None:  # one wake-up, on the path the request waits on
                assert self.conn.lrange(keys.notify_key(job_id), 0, -1) == [b"1"]
            else:
                assert not self.conn.exists(keys.notify_key(job_id))


TAKE_FIELDS = ("data", "status", "timeout", "result_ttl", "failure_ttl", "lapses", "tokens", "deliveries",
               "success_callback_name", "failure_callback_name", "stopped_callback_name")


@EXAMPLES
@given(field=st.sampled_from(TAKE_FIELDS), value=VALUES, records=RECORDS)
def test_take_a_bad_field_fails_one_job_alone(redis_client, field, value, records):
    round_ = Round(redis_client, records)
    redis_client.hset(rqkeys.rq_job_key(round_.victim), field, value)
    taken = round_.take()
    assert set(taken) == set(round_.ids)  # every id of the round was read in the one atomic take
    assert all(taken[i].kind is Kind.STARTED for i in round_.others)
    victim = taken[round_.victim]
    if victim.kind is Kind.BAD:
        assert field in victim.reason
    if field.endswith("_callback_name") and victim.claimed:  # blanked as it is taken: never imported by anyone
        assert redis_client.hget(rqkeys.rq_job_key(round_.victim), field) == b""
    round_.schema.finish(round_.answers(taken), 0.1)
    round_.assert_others_served()
    places = round_.place_of(round_.victim)
    if victim.kind is Kind.BAD:
        assert places == {"failed"} and round_.answered(round_.victim).error_code == "decode_error"
        assert field.encode() in zlib.decompress(redis_client.hget(rqkeys.rq_job_key(round_.victim), "exc_info"))
    elif victim.kind is Kind.STARTED:
        assert round_.served(round_.victim)
    else:  # what the field now says: cancelled, already ended, or no data (rq drops such an entry)
        assert victim.kind in (Kind.CANCELED, Kind.STALE, Kind.MISSING), victim.kind
    assert not redis_client.exists(rqkeys.rq_queue_key(round_.queue))  # nothing left behind in the queue


@EXAMPLES
@given(key=st.sampled_from(("job", "executions", "tokens", "canceled", "worker", "worker_executions")),
       kind=st.sampled_from(TYPES), records=RECORDS)
def test_take_a_key_of_a_foreign_type_loses_no_job(redis_client, key, kind, records):
    round_ = Round(redis_client, records)
    target = {"job": rqkeys.rq_job_key(round_.victim), "executions": rqkeys.RQ_EXECUTIONS_PREFIX + round_.victim,
              "tokens": keys.queued_tokens_key(round_.queue), "canceled": rqkeys.rq_canceled_key(round_.queue),
              "worker": rqkeys.rq_worker_key(round_.schema.worker_name),
              "worker_executions": rqkeys.rq_worker_executions_key(round_.schema.worker_name)}[key]
    plant(redis_client, target, kind)
    taken = round_.take()
    round_.schema.finish(round_.answers(taken), 0.1)
    round_.assert_others_served()
    if key == "job":  # a planted hash holds no data: failed with that reason; another type: no job, dropped
        assert taken[round_.victim].kind is (Kind.BAD if kind == "hash" else Kind.MISSING)
        if kind == "hash":
            assert "has no data field" in round_.answered(round_.victim).error_message
    else:
        assert round_.served(round_.victim)


FINISH_FIELDS = ("retries_left", "enqueue_at_front_on_retry", "status")


@EXAMPLES
@given(field=st.sampled_from(FINISH_FIELDS), value=VALUES, retry=st.booleans(), records=RECORDS)
def test_finish_a_bad_field_answers_every_other_job(redis_client, field, value, retry, records):
    round_ = Round(redis_client, records)
    taken = round_.take()
    redis_client.hset(rqkeys.rq_job_key(round_.victim), field, value)  # changed while the job runs
    outcome = (lambda i: Outcome.RETRY if i == round_.victim else Outcome.FINISHED) if retry else \
        (lambda i: Outcome.FINISHED)
    done = round_.schema.finish(round_.answers(taken, outcome), 0.1)
    round_.assert_others_served()
    places = round_.place_of(round_.victim)
    if not retry:
        assert round_.served(round_.victim)
    elif places == {"queued"}:  # requeued: its retries_left (2, or the planted whole number) was above 0
        assert (field != "retries_left" or int(value) > 0) and done.requeued == 1
    else:  # failed: no retries left, or a count no script can trust (said among the problems)
        assert places == {"failed"} and round_.answered(round_.victim).ok is True  # its rows still answered it
        assert done.failed == 1


@EXAMPLES
@given(key=st.sampled_from(("job", "results", "executions", "notify", "result", "options", "reply", "wip",
                            "finished", "worker")),
       kind=st.sampled_from(TYPES), records=RECORDS)
def test_finish_a_key_of_a_foreign_type_answers_every_other_job(redis_client, key, kind, records):
    round_ = Round(redis_client, records)
    taken = round_.take()
    reply = round_.reply = keys.reply_stream_key(uuid.uuid4().hex)
    target = {"job": rqkeys.rq_job_key(round_.victim), "results": rqkeys.RQ_RESULTS_PREFIX + round_.victim,
              "executions": rqkeys.RQ_EXECUTIONS_PREFIX + round_.victim, "notify": keys.notify_key(round_.victim),
              "result": keys.result_key(round_.victim), "options": keys.job_options_key(round_.victim),
              "reply": reply, "wip": rqkeys.rq_wip_key(round_.queue), "finished": rqkeys.rq_finished_key(round_.queue),
              "worker": rqkeys.rq_worker_key(round_.schema.worker_name)}[key]
    plant(redis_client, target, kind)
    answers = round_.answers(taken)
    for answer in answers:
        answer.reply_to = reply  # every request of the round waits on the same reply stream
    round_.schema.finish(answers, 0.1)
    if key == "wip" or (key == "finished" and kind != "zset" and records == "full") or \
            (key == "job" and kind != "hash" and records == "lean"):
        # the round's claims (or its registry) are gone: every answer is still published, nothing is lost
        for job_id in round_.ids:
            assert round_.answered(job_id).ok
        return
    round_.assert_others_served()
    if key != "result":  # a result key planted first keeps the first answer (SET NX): the victim's is lost
        assert round_.answered(round_.victim).ok
    if key == "reply" and kind != "stream":
        return  # no wake-up on a reply stream someone replaced (that one write is lost, nothing else)
    woken = {entry[1].get(b"id", b"").decode() for entry in redis_client.xrange(reply)}
    assert set(round_.others) <= woken


@EXAMPLES
@given(field=st.sampled_from(("lapses", "tokens", "status")), value=VALUES, records=RECORDS)
def test_recover_a_bad_field_requeues_every_job_once(redis_client, field, value, records):
    round_ = Round(redis_client, records)
    taken = round_.take()
    redis_client.hset(rqkeys.rq_job_key(round_.victim), field, value)
    wip = rqkeys.rq_wip_key(round_.queue)
    redis_client.zadd(wip, dict.fromkeys(redis_client.zrange(wip, 0, -1), 0))  # their worker died: lapsed
    recovered = round_.schema.recover()
    queued = [i.decode() for i in redis_client.lrange(rqkeys.rq_queue_key(round_.queue), 0, -1)]
    assert set(round_.others) <= {r.id for r in recovered} and set(round_.others) <= set(queued)
    assert len(queued) == len(set(queued))  # each once
    assert redis_client.zcard(wip) == 0  # no claim left behind
    for job_id in round_.others:
        assert redis_client.hget(rqkeys.rq_job_key(job_id), "lapses") == b"1"
    if field == "status" and value not in ("started", b"started"):
        assert round_.victim not in queued  # not started any more: its claim only was removed
    else:
        assert round_.victim in queued
        # a count no script can trust is not counted: the next take fails the job with the reason
        retaken = round_.take()
        lapses_ok = field != "lapses" or (lua_integer(value) and int(value) + 1 >= 0)  # counted when it can be
        tokens_ok = field != "tokens" or (lua_integer(value) and int(value) >= 0)
        assert retaken[round_.victim].kind is (Kind.STARTED if lapses_ok and tokens_ok else Kind.BAD)
    assert {t.id for t in taken.values()} == set(round_.ids)


@EXAMPLES
@given(key=st.sampled_from(("job", "tokens", "canceled", "notify", "result", "reply", "queue_entry")),
       kind=st.sampled_from(TYPES), value=VALUES, records=RECORDS)
def test_cancel_a_hostile_key_or_field_cancels_only_its_own(redis_client, key, kind, value, records):
    round_ = Round(redis_client, records)
    reply = keys.reply_stream_key(uuid.uuid4().hex)
    if key == "queue_entry":
        redis_client.hset(rqkeys.rq_job_key(round_.victim), "tokens", value)
    else:
        plant(redis_client, {"job": rqkeys.rq_job_key(round_.victim), "tokens": keys.queued_tokens_key(round_.queue),
                             "canceled": rqkeys.rq_canceled_key(round_.queue), "notify": keys.notify_key(round_.victim),
                             "result": keys.result_key(round_.victim), "reply": reply}[key], kind)
    answer = Result.failure(round_.victim, round_.model, DecodeError("cancelled", b""))
    assert answering.cancel(redis_client, round_.queue, answer, reply) is True
    assert answering.cancel(redis_client, round_.queue, answer, reply) is False  # once
    queued = [i.decode() for i in redis_client.lrange(rqkeys.rq_queue_key(round_.queue), 0, -1)]
    assert queued == round_.others  # the others are untouched, in their order
    if key != "result" or kind == "string":
        assert redis_client.get(keys.result_key(round_.victim)) is not None or key == "result"
    taken = round_.take()  # the rest of the round is served as usual
    round_.schema.finish(round_.answers(taken), 0.1)
    round_.assert_others_served()


def spread(conn, model: str, parts: int = 3) -> tuple[str, list[EmbedRequest]]:
    """A spread request's join state and its parts, as worker/serving/spread.py writes them."""
    parent = uuid.uuid4().hex
    plan = b"\x80"  # an empty msgpack map: enough for the join, which only stores and counts
    conn.hset(keys.chunks_key(parent), mapping={"plan": plan, "parts": parts})
    requests = [EmbedRequest(id=keys.part_id(parent, k), model=model, inputs=[[1, 2, 3]],
                             part_of=PartOf(parent=parent, index=k, parts=parts)) for k in range(parts)]
    return parent, requests


@EXAMPLES
@given(field=st.sampled_from(("parts", "done", "failed", "plan", "part:1", "type")), value=VALUES)
def test_join_a_bad_join_state_answers_its_request_and_no_other(redis_client, field, value):
    model = f"hostile-{uuid.uuid4().hex[:10]}"
    victim, bad_parts = spread(redis_client, model)
    other, good_parts = spread(redis_client, model)
    if field == "type":
        plant(redis_client, keys.chunks_key(victim), "list")
    else:
        redis_client.hset(keys.chunks_key(victim), field, value)
    blob = Result.success("x", model, np.ones((1, 4), np.float32), "float32", "little", 3).encode()
    for part in bad_parts:  # must never raise, whatever the state holds
        joined = answering.join(redis_client, victim, part.part_of.index, blob, True)
        assert joined.code in (-1, 0, 1, 2, 3)
    codes = [answering.join(redis_client, other, p.part_of.index, blob, True).code for p in good_parts]
    assert codes == [0, 0, 1]  # the other spread request completes, untouched


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_a_planted_callback_is_blanked_at_take_and_a_bad_round_stays_whole(redis_client, records):
    """The documented producer rights can write any job hash: a take still never stops half-way, whatever a
    round holds at once (several bad jobs, a foreign-typed claim registry for another queue)."""
    round_ = Round(redis_client, records)
    redis_client.hset(rqkeys.rq_job_key(round_.ids[0]), mapping={"failure_callback_name": "this.s", "deliveries": "x"})
    redis_client.hset(rqkeys.rq_job_key(round_.ids[1]), "lapses", "-3")
    redis_client.hset(rqkeys.rq_job_key(round_.ids[2]), "timeout", "nan")
    taken = round_.take()
    assert [taken[i].kind for i in round_.ids[:3]] == [Kind.BAD, Kind.BAD, Kind.BAD]
    assert all(taken[i].kind is Kind.STARTED for i in round_.ids[3:])
    assert redis_client.hget(rqkeys.rq_job_key(round_.ids[0]), "failure_callback_name") == b""
    round_.schema.finish(round_.answers(taken), 0.1)
    for job_id in round_.ids[:3]:
        assert round_.place_of(job_id) == {"failed"}
    for job_id in round_.ids[3:]:
        assert round_.served(job_id)


@pytest.mark.parametrize("kind", [k for k in TYPES if k != "list"])
def test_a_queue_key_of_a_foreign_type_is_left_alone(redis_client, kind):
    round_ = Round(redis_client)
    other = Round(redis_client)
    plant(redis_client, rqkeys.rq_queue_key(round_.queue), kind)
    suspended, taken = take_from([round_.schema, other.schema], ROUND * 3, None)
    assert {t.id for t in taken} == set(other.ids)  # the next level is still served
    with pytest.raises(redis.ResponseError, match="no list"):  # an enqueue says what is wrong, writes nothing
        enqueueing.enqueue(redis_client, enqueueing.enqueue_args(round_.queue, [EmbedRequest(model="m", inputs=["x"])]))
