"""The table of Redis faults (producer/client/redisfaults.py) for the faults a test cannot cheaply make on a real
server (MASTERDOWN, NOREPLICAS, a cluster that covers no node for a slot): each error reply parsed by redis-py's own
parser, as a client meets it. The faults made on real servers: tests/faults/test_redis_faults.py."""

from __future__ import annotations

import pytest
import redis
from redis._parsers.base import BaseParser

from embedfleet.common.errors import UnavailableError
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.client.redisfaults import outage

REPLIES = {  # Redis's reply -> what our message must say
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": "MASTERDOWN Link",
    "NOREPLICAS Not enough good replicas to write.": "min-replicas-to-write",
    "CLUSTERDOWN The cluster is down": "CLUSTERDOWN The cluster is down",
    "LOADING Redis is loading the dataset in memory": "LOADING Redis is loading",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.": "SCRIPT KILL",
    "OOM command not allowed when used memory > 'maxmemory'.": "Redis is full",
    "READONLY You can't write against a read only replica.": "read-only replica",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.": "MISCONF",
}


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: r.split()[0])
def test_each_fault_reply_is_unavailable_quoting_redis(reply):
    with pytest.raises(UnavailableError, match=REPLIES[reply]) as caught, redis_errors():
        raise BaseParser.parse_error(reply)
    assert caught.value.code == "redis_unavailable"
    assert "retry" in caught.value.message


@pytest.mark.parametrize("exc", [redis.exceptions.SlotNotCoveredError('Slot "6293" is not covered by the cluster.'),
                                 redis.exceptions.RedisClusterUnreachableError("Redis Cluster cannot be connected.")],
                         ids=lambda e: type(e).__name__)
def test_a_cluster_without_a_node_for_the_slot_is_an_outage(exc):
    assert outage(exc)
    with pytest.raises(UnavailableError, match="Redis Cluster cannot serve"), redis_errors():
        raise exc


@pytest.mark.parametrize("exc", [BaseParser.parse_error("WRONGTYPE Operation against a key holding the wrong kind"),
                                 redis.exceptions.RedisClusterException("No way to dispatch this command"),
                                 redis.exceptions.DataError("Invalid input of type: 'dict'")],
                         ids=lambda e: type(e).__name__)
def test_what_is_no_redis_fault_stays_as_it_was(exc):
    """Input, or a bug of ours: not said as a retryable outage."""
    assert not outage(exc)
    with pytest.raises(type(exc)), redis_errors():
        raise exc
