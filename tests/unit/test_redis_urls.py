"""Redis URLs read at parse time (common/redisurls.py check_url, identity, redact) and the shard map's lists of them
(common/shards.py): what is refused, in which words, and that no message holds the password. No Redis: the
commands are run in tests/e2e/test_redis_urls.py."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from embedfleet.common.errors import StartupError
from embedfleet.common.redisurls import RedisURLError, check_url, identity, redact
from embedfleet.common.shards import ShardMap, parse_shards

SECRET = "Pw1Leak/Pw2Leak?Pw3Leak#Pw4Leak"  # each character a URL must encode, between parts that must not leak
ENCODED = quote(SECRET, safe="")


@pytest.mark.parametrize("url, why", [
    ("redis://127.0.0.1:99999/0", "port '99999' is not a number from 1 to 65535"),
    ("redis://127.0.0.1:abc/0", "port 'abc' is not a number"),
    ("redis://127.0.0.1:0/0", "port '0' is not a number"),
    (f"redis://fleet:{ENCODED}@127.0.0.1:99999/0", "port '99999'"),
    ("redis://127.0.0.1:6379/99999", "DB '99999' of redis://127.0.0.1:6379/99999 is not a number from 0 to 9999"),
    ("redis://127.0.0.1:6379/x", "DB 'x'"),
    ("redis://127.0.0.1:6379/0?db=x", "DB 'x'"),
    ("redis://127.0.0.1:6379/0/1", "is not /DB"),
    (f"redis://fleet:{SECRET}@127.0.0.1:6379/0", "holds an unencoded '/', '?' or '#'"),
    (f"redis://:{SECRET}@127.0.0.1:6379/0", "percent-encode them"),
    (f"redis+cluster://:{SECRET}@127.0.0.1:7000", "holds an unencoded"),
    ("127.0.0.1:6379", "is not a Redis URL (it does not start with a scheme://)"),
    ("http://127.0.0.1:6379/0", "its scheme is none of redis://"),
    ("", "empty"),
    ("redis://h1:7000,h2:7001/0", "names several hosts"),
    ("redis+cluster://h1:7000/3", "a cluster has DB 0 only"),
    ("redis+cluster://h1:abc", "port 'abc'"),
    ("redis+sentinel://s1:26379", "not a Sentinel URL"),
    ("redis+sentinel://s1:26379/mymaster/x", "DB 'x'"),
    ("unix://tmp/redis.sock", "three slashes"),
])
def test_a_malformed_url_is_one_line_naming_the_setting_never_the_password(url, why):
    with pytest.raises(RedisURLError) as caught:
        check_url(url, "--redis-url")
    message = str(caught.value)
    assert message.startswith("--redis-url: ") and why in message and "\n" not in message, message
    assert "Leak" not in message, message
    assert isinstance(caught.value, StartupError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis://localhost", "redis:///0", "rediss://fleet:p%2Fw@10.0.0.5:6380/3",
    f"redis://:{ENCODED}@127.0.0.1:6379/0", "redis://[::1]:6379/0", "redis://h:6379/0?db=2",
    "rediss://h:6380/0?ssl_ca_certs=%2Fpki%2Fca.crt", "redis+cluster://h1:7000,h2:7001#p0",
    "rediss+cluster://:pw@h1:7000/0", "redis+sentinel://:pw@s1:26379,s2/mymaster/2?sentinel_password=x",
    "unix:///run/redis.sock?db=1", "redis://user:p,w:d@h:1/0",
])
def test_the_documented_forms_pass(url):
    assert check_url(url, "--redis-url") == url


def test_redact_hides_a_password_cut_short_by_an_unencoded_character():
    for url in (f"redis://fleet:{SECRET}@127.0.0.1:6379/0", f"redis://:{SECRET}@h:1/0", f"{SECRET}@h:1"):
        assert "Leak" not in redact(url) and redact(url).endswith("***@" + url.rpartition("@")[2]), redact(url)
    assert redact(f"redis://fleet:{ENCODED}@h:1/0") == "redis://fleet:***@h:1/0"


@pytest.mark.parametrize("one, other", [
    ("redis://localhost:6379/0", "redis://127.0.0.1:6379"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/"),
    ("redis://127.0.0.1", "redis://[::1]:6379/0"),
    ("redis://:a@Host.Example:6379/0", "rediss://user:b@host.example:6379/0?ssl_ca_certs=x"),
    ("redis://h:6379/0?db=2", "redis://h:6379/2"),
    ("redis+cluster://a:1,b:2#p", "redis+cluster://b:2,a:1#p"),
    ("redis+sentinel://s1,s2/m", "redis+sentinel://s2:26379,s1:26379/m/0"),
])
def test_one_redis_under_two_spellings_is_one_identity(one, other):
    assert identity(one) == identity(other)


@pytest.mark.parametrize("one, other", [
    ("redis://h:6379/0", "redis://h:6379/1"), ("redis://h:6379/0", "redis://h:6380/0"),
    ("redis://localhost:6379/0", "redis://10.0.0.5:6379/0"),  # no DNS: another name is another Redis
    ("redis+cluster://a:1#p0", "redis+cluster://a:1#p1"),  # two partitions on one cluster, each its own slot
])
def test_two_redis_are_two_identities(one, other):
    assert identity(one) != identity(other)


@pytest.mark.parametrize("text, why", [
    ("m=redis://a:1/0,127.0.0.1:2", "after a comma comes '127.0.0.1:2', which is no URL (it lacks a scheme)"),
    ("m=redis://a:1/0,localhost", "lacks a scheme"),
    ("m=redis://localhost:6379/0,redis://127.0.0.1:6379", "names a Redis twice among its partitions: "
                                                         "redis://localhost:6379/0 and redis://127.0.0.1:6379"),
    ("m=redis://h:1/0,redis://h:1/", "names a Redis twice"),
    ("m=redis://h:1/0,redis://h:abc/0", "model 'm', partition 2: port 'abc'"),
    (f"m=redis://h:1/0,redis://:{SECRET}@h:2/0", "partition 2: the user or password"),
    (f"m=redis://:{ENCODED}@h:1/0,redis://:{ENCODED}@H:1", "redis://:***@h:1/0 and redis://:***@H:1"),
])
def test_a_bad_partition_list_is_refused_without_its_passwords(text, why):
    with pytest.raises(RedisURLError) as caught:
        parse_shards(text)
    assert why in str(caught.value) and "Leak" not in str(caught.value), str(caught.value)


def test_a_json_shard_map_is_checked_too_and_never_echoes_its_values(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"m": ["redis://h:1/0", "redis://h:99999/0"]}))
    with pytest.raises(RedisURLError, match=f"{path}: model 'm', partition 2: port '99999'"):
        parse_shards(f"@{path}")
    path.write_text(json.dumps({"m": {"url": f"redis://:{SECRET}@h"}}))
    with pytest.raises(RedisURLError, match="non-empty list") as caught:
        parse_shards(f"@{path}")
    assert "Leak" not in str(caught.value)


def test_a_producers_map_is_checked_where_it_is_built():
    with pytest.raises(RedisURLError, match="redis_url: port '99999'"):
        ShardMap("redis://127.0.0.1:99999/0")
    with pytest.raises(RedisURLError, match="shards: model 'm' names a Redis twice"):
        ShardMap("redis://h:1/0", {"m": ["redis://localhost:7/0", "redis://127.0.0.1:7"]})
    with pytest.raises(RedisURLError, match="shards: model 'm', partition 1: DB 'x'"):
        ShardMap("redis://h:1/0", {"m": ["redis://h:7/x", "redis://h:8/0"]})
