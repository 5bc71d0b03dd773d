"""Redis Cluster URLs and the hash-tagged key layout (common/redisclient.py, common/protocol/keys.py), no Redis."""

from __future__ import annotations

import pytest

from embedfleet.common.names import slot_tag, tag_of, tagged_request_id, untagged, valid_request_id
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.redisclient import is_cluster, parse_cluster, with_tls


def test_a_cluster_url_gives_its_seed_nodes_and_credentials():
    nodes, kwargs = parse_cluster("rediss+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001,h3")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("h3", 6379)]
    assert kwargs == {"username": "u", "password": "p@ss", "ssl": True}
    assert is_cluster("redis+cluster://h:1") and not is_cluster("redis://h:1/0")
    assert "ssl_ca_certs" in with_tls("rediss+cluster://h:1", ca="/ca.pem")


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://h:1/3", "redis+cluster://h:port"])
def test_a_malformed_cluster_url_says_the_form(url):
    with pytest.raises(ValueError, match="redis\\+cluster://"):
        parse_cluster(url)


def test_a_models_keys_share_its_tag_and_plain_names_keep_theirs():
    tag = slot_tag("minilm")
    request_id = tagged_request_id(tag)
    assert valid_request_id(request_id) and tag_of(request_id) == tag
    assert keys.queue_name("minilm", "bulk", tag) == tag + keys.queue_name("minilm", "bulk")
    assert untagged(keys.queue_name("minilm", tag=tag)) == "embedfleet.minilm"
    assert keys.queue_name("minilm") == "embedfleet.minilm"  # a plain Redis: unchanged
    assert keys.is_reply_stream_key(keys.reply_stream_key(request_id))
    assert rqkeys.rq_suspended_key() == "rq:suspended" and rqkeys.rq_suspended_key(tag).endswith(tag)


@pytest.mark.parametrize("bad", ["{}abc", "{a b}abc", "{x}", "{" + "a" * 17 + "}abc", "abc{x}", "{x}{y}abc"])
def test_an_id_with_a_malformed_tag_is_no_request_id(bad):
    assert not valid_request_id(bad)


def test_a_partition_of_a_cluster_url_has_a_tag_of_its_own():
    from embedfleet.common.redisurls import cluster_tag

    url = "redis+cluster://h:7000,h:7001"
    assert cluster_tag(url, "m") == slot_tag("m") != cluster_tag(url + "#p1", "m") == slot_tag("m", "p1")
    assert cluster_tag("redis://h:6379/0", "m") == "" and cluster_tag("redis://h:6379/0#p1", "m") == ""
    assert parse_cluster(url + "#p1") == parse_cluster(url)  # the partition is ours, not the client's


def test_a_partition_map_keeps_a_clusters_seed_list_whole():
    from embedfleet.common.redisurls import cluster_tag
    from embedfleet.common.shards import parse_shards

    seeds = "redis+cluster://n1:7000,n2:7001"
    (partitions,) = parse_shards(f"m={seeds}#p0,{seeds}#p1").values()
    assert partitions == [f"{seeds}#p0", f"{seeds}#p1"]
    assert len({cluster_tag(url, "m") for url in partitions}) == 2
