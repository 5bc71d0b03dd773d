"""A model over several Redis (common/shards.py): the shard map's list forms, and where producers place requests
(producer/client/placement.py). No Redis: the fleet tests serve them (tests/fleet/test_partitions.py)."""

from __future__ import annotations

import json

import pytest

from embedfleet.common.names import slot_tag, tag_of, untagged
from embedfleet.common.protocol import batchkeys
from embedfleet.common.redisurls import cluster_tag
from embedfleet.common.shards import ShardMap, parse_shards
from embedfleet.producer.client.placement import Placer, partition_of, unavailable
from embedfleet.producer.gateway.batches.lines import request_id_of
from embedfleet.common.errors import UnavailableError

A, B, C = "redis://h:1/0", "redis://h:2/0", "rediss://h:3/0"


def test_a_models_urls_split_only_where_a_scheme_follows_the_comma(tmp_path):
    assert parse_shards(f"m={A},{B},{C};n={A}") == {"m": [A, B, C], "n": [A]}
    # commas inside one URL stay in it: a cluster's seed list, a sentinel's hosts, a query
    assert parse_shards(f"m=redis+cluster://h1:1,h2:2,{B} n=redis+sentinel://s1:1,s2:2/mymaster?x=1,y=2") == {
        "m": ["redis+cluster://h1:1,h2:2", B], "n": ["redis+sentinel://s1:1,s2:2/mymaster?x=1,y=2"]}
    as_json = tmp_path / "map.json"
    as_json.write_text(json.dumps({"m": [A, B], "n": C}))
    assert parse_shards(f"@{as_json}") == {"m": [A, B], "n": [C]}
    as_lines = tmp_path / "map.txt"
    as_lines.write_text(f"# model = its partitions\nm={A},{B}  # two\nn={C}\n")
    assert parse_shards(f"@{as_lines}") == {"m": [A, B], "n": [C]}


@pytest.mark.parametrize("bad, why", [(f"m={A},{A}", "names a Redis twice"), (f"m={A} m={B}", "mapped twice"),
                                      (f"m=x,{A}", "not a Redis URL"), ("m=", "not MODEL=URL")])
def test_bad_partition_lists_are_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_shards(bad)


@pytest.mark.parametrize("body", ['{"m": []}', '{"m": [1]}', '{"m": {"a": 1}}'])
def test_bad_json_partition_lists_are_refused(tmp_path, body):
    path = tmp_path / "map.json"
    path.write_text(body)
    with pytest.raises(ValueError, match="non-empty list"):
        parse_shards(f"@{path}")


def test_the_map_knows_each_models_partitions():
    shards = ShardMap(A, {"m": [B, C], "n": B})
    assert shards.partitions("m") == [B, C] and shards.partitions("n") == [B] and shards.partitions("x") == [A]
    assert shards.url_for("m") == B and shards.urls() == [A, B, C]
    assert shards.owns(C, "m") and not shards.owns(C, "n") and shards.owns(A, "x")
    # C carries only a partitioned model: the fleet can do without it; B also carries n, whose only Redis it is
    assert shards.spare(C) and not shards.spare(B) and not shards.spare(A)


def test_round_robin_spreads_evenly_and_puts_a_refusing_partition_last():
    placer = Placer(ShardMap(A, {"m": [A, B, C]}))
    firsts = [placer.order("m")[0] for _ in range(300)]
    assert {url: firsts.count(url) for url in (A, B, C)} == {A: 100, B: 100, C: 100}
    placer.refused(B)
    orders = [placer.order("m") for _ in range(30)]
    assert all(order[-1] == B and sorted(order) == sorted([A, B, C]) for order in orders)
    placer.accepted(B)  # back: in its turn again
    assert {placer.order("m")[0] for _ in range(3)} == {A, B, C}


def test_the_callers_own_ids_go_each_to_its_home_whatever_order_the_map_lists():
    placer = Placer(ShardMap(A, {"m": [A, B, C]}))
    reversed_map = Placer(ShardMap(A, {"m": [C, B, A]}))
    ids = [f"order-{i}" for i in range(60)]
    homes = {request_id: partition_of([A, B, C], request_id) for request_id in ids}
    assert set(homes.values()) == {A, B, C}  # spread
    for planner in (placer, reversed_map, placer):  # fixed: the same home every time, by any producer
        plan = planner.plan("m", ids)
        assert all(order == [homes[ids[indices[0]]]] for order, indices in plan)  # never moved elsewhere
        assert {ids[i]: order[0] for order, indices in plan for i in indices} == homes
    assert Placer(ShardMap(A)).order("m") == [A]


def test_a_submit_of_many_new_requests_spreads_over_the_partitions():
    placer = Placer(ShardMap(A, {"m": [A, B, C]}))
    plan = placer.plan("m", [None] * 10)
    assert sorted(len(indices) for _, indices in plan) == [3, 3, 4]
    assert sorted(i for _, indices in plan for i in indices) == list(range(10))
    assert all(sorted(order) == sorted([A, B, C]) and order[0] not in order[1:] for order, _ in plan)
    placer.refused(B)  # a partition that just refused gets none while the others take them
    plan = placer.plan("m", [None] * 10)
    assert {order[0] for order, _ in plan} == {A, C} and all(order[-1] == B for order, _ in plan)
    assert Placer(ShardMap(A)).plan("m", [None] * 3) == [([A], [0, 1, 2])]


def test_a_down_partitions_error_names_it():
    shards = ShardMap(A, {"m": [B, C]})
    named = unavailable(shards, C, UnavailableError("Redis is unreachable: refused"))
    assert isinstance(named, UnavailableError) and named.code == UnavailableError("x").code
    assert "partition 2 of 2 of model 'm'" in str(named) and "h:3" in str(named) and "refused" in str(named)
    assert unavailable(shards, C, named) is named  # named once
    plain = UnavailableError("Redis is unreachable")
    assert unavailable(shards, A, plain) is plain


def test_a_batch_lines_id_on_a_cluster_carries_the_tag_of_the_partition_it_goes_to():
    """A batch line's id (fixed before its submit: a replica taking the batch over submits it again under the
    same id) must land on the partition whose hash tag it carries; on a plain Redis it is as it always was."""
    plain = ["redis://127.0.0.1:6379/0", "redis://127.0.0.1:6380/0"]
    assert request_id_of("batch_x", 7, "m", plain) == batchkeys.batch_line_request_id("batch_x", 7) == "batch_x-7"
    one = ["redis+cluster://127.0.0.1:7000"]
    assert request_id_of("batch_x", 7, "m", one) == slot_tag("m") + "batch_x-7"
    assert request_id_of("batch_x", 7, None, one) == "batch_x-7"  # no model known: the submit says why
    three = [f"redis+cluster://127.0.0.1:7000#p{i}" for i in range(3)]
    for index in range(300):
        request_id = request_id_of("batch_x", index, "m", three)
        assert request_id == request_id_of("batch_x", index, "m", three)  # fixed
        assert tag_of(request_id) == cluster_tag(partition_of(three, request_id), "m")
        assert untagged(request_id).startswith(f"batch_x-{index}")
