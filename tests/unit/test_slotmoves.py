"""What a Redis Cluster slot being moved looks like to a client, and sending again until the move ends
(common/protocol/slotmoves.py); the producer's clear error when it does not end in time. No Redis: the errors
are redis-py's own classes, raised by a callable that stands in for a command."""

from __future__ import annotations

import asyncio

import pytest
import redis

from embedfleet.common.errors import UnavailableError
from embedfleet.common.protocol import slotmoves
from embedfleet.producer.client.redisfaults import redis_errors

MOVING = [redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
          redis.exceptions.AskError("3135 127.0.0.1:7001"),
          redis.exceptions.ClusterError("TTL exhausted."),
          redis.ResponseError("Script attempted to access a non local key in a cluster node script: 9d72")]
NOT_MOVING = [redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
              redis.exceptions.ClusterError("Cluster mode is not enabled on this node"),
              redis.ConnectionError("Connection refused")]


@pytest.mark.parametrize("exc", MOVING, ids=lambda e: type(e).__name__)
def test_a_slot_being_moved_is_told_by_its_errors(exc):
    assert slotmoves.slot_moving(exc)


@pytest.mark.parametrize("exc", NOT_MOVING, ids=lambda e: str(e)[:20])
def test_other_errors_are_not_a_move(exc):
    assert not slotmoves.slot_moving(exc)


def _failing(errors: list[BaseException]):
    calls = []

    def call():
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "ran"

    return call, calls


def test_a_command_is_sent_again_until_the_move_ends():
    call, calls = _failing(list(MOVING))
    assert slotmoves.while_moving(call) == "ran" and len(calls) == len(MOVING) + 1


def test_another_error_is_raised_at_once():
    call, calls = _failing([NOT_MOVING[0]])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        slotmoves.while_moving(call)
    assert len(calls) == 1


def test_a_move_that_outlasts_the_wait_raises_its_last_error():
    call, calls = _failing([redis.exceptions.TryAgainError("again")] * 1000)
    with pytest.raises(redis.exceptions.TryAgainError):
        slotmoves.while_moving(call, wait=0.05)
    assert 1 < len(calls) < 1000


def test_a_producer_says_a_move_that_did_not_settle_clearly():
    with pytest.raises(UnavailableError, match="being moved") as caught, redis_errors():
        raise redis.exceptions.ClusterError("TTL exhausted.")
    assert caught.value.code == "redis_unavailable"
    with pytest.raises(redis.exceptions.ClusterError), redis_errors():  # anything else stays what it was
        raise redis.exceptions.ClusterError("Cluster mode is not enabled on this node")


def test_an_async_command_is_sent_again_until_the_move_ends():
    call, calls = _failing(list(MOVING))

    async def command():
        return call()

    assert asyncio.run(slotmoves.while_moving_async(command)) == "ran" and len(calls) == len(MOVING) + 1
