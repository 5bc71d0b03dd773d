"""Where a webhook may go (issue #19): the URL policy as a pure function (a table of cases, and properties
with hypothesis), then over HTTP against real gateways, a real worker and a real redis-server.

No test here sends anything anywhere but loopback: a URL naming a private, link-local or other address is
refused at validation (the 400 answer), never by trying it; the connect-time check is shown with
`localhost`, which resolves to loopback from /etc/hosts, and a loopback receiver that counts connections.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embedfleet.common.protocol import keys
from embedfleet.producer.gateway.jobs.webhookurls import WebhookPolicy, WebhookRefusedError, loggable, refusal
from tests.gatewayserver import Server, settings
from tests.nullworker import NULL, null_worker
from tests.webhooks import SECRET

STRICT = WebhookPolicy()  # the default: https to public addresses only


@pytest.mark.parametrize("url, words", [
    ("https://hooks.example.com/ci?token=t", None),
    ("https://8.8.8.8:8443/hook", None),
    ("https://[2606:4700::1111]/hook", None),
    ("https://[::ffff:8.8.8.8]/hook", None),  # a public IPv4 address in IPv6 clothing
    ("HTTPS://Hooks.Example.COM./x", None),
    ("http://hooks.example.com/ci", ["must be an https URL", "--webhook-allow-http", "'http'"]),
    ("file:///etc/passwd", ["must be an https URL", "'file'"]),
    ("hooks.example.com/ci", ["must be an https URL", "''"]),
    ("https://user:pw@hooks.example.com/", ["must not carry credentials"]),
    ("https://user@hooks.example.com/", ["must not carry credentials"]),
    ("https:///path", ["names no host"]),
    ("https://hooks.example.com:0/", ["port 0 is out of range"]),
    ("https://hooks.example.com:70000/", ["port 70000 is out of range"]),
    ("https://hooks example.com/", ["is not a host name"]),
    ("https://hooks.example.com\x00/", ["not a valid URL"]),
    ("https://0.0.0.0/", ["0.0.0.0 is an unspecified address", "only public addresses", "--webhook-allow-hosts"]),
    ("https://[::]/", ["unspecified address"]),
    ("https://127.0.0.1/", ["loopback address"]),
    ("https://127.255.0.9/", ["loopback address"]),
    ("https://[::1]/", ["loopback address"]),
    ("https://10.1.2.3/", ["private address"]),
    ("https://172.16.0.1/", ["private address"]),
    ("https://172.31.255.254/", ["private address"]),
    ("https://192.168.1.1/", ["private address"]),
    ("https://169.254.169.254/latest/meta-data", ["link-local address"]),
    ("https://[fe80::1]/", ["link-local address"]),
    ("https://[fc00::1]/", ["private address"]),
    ("https://[fd12:3456::1]/", ["private address"]),
    ("https://224.0.0.1/", ["multicast address"]),
    ("https://[ff02::1]/", ["multicast address"]),
    ("https://240.0.0.1/", ["reserved address"]),
    ("https://100.64.0.1/", ["not globally reachable"]),
    ("https://[::ffff:127.0.0.1]/", ["loopback address (127.0.0.1 inside IPv6)"]),
    ("https://[::ffff:10.0.0.1]/", ["private address (10.0.0.1 inside IPv6)"]),
    ("https://[2002:a9fe:a9fe::1]/", ["link-local address (169.254.169.254 inside IPv6)"]),  # 6to4
    ("https://[64:ff9b::7f00:1]/", ["loopback address (127.0.0.1 inside IPv6)"]),  # NAT64
    ("https://[::127.0.0.1]/", ["reserved address"]),  # IPv4-compatible (deprecated)
    ("https://127.1/", ["legacy form", "four decimal numbers"]),
    ("https://2130706433/", ["legacy form"]),
    ("https://0x7f000001/", ["legacy form"]),
])
def test_the_url_policy_without_a_lookup(url, words):
    if words is None:
        assert STRICT.check_url(url).url.scheme == "https"
        return
    with pytest.raises(WebhookRefusedError) as refused:
        STRICT.check_url(url)
    assert refused.value.param == "webhook" and refused.value.code == "invalid_request"
    assert all(word in refused.value.message for word in words), refused.value.message


@pytest.mark.parametrize("flags, url, allowed", [
    ((True, None), "http://hooks.example.com/", True),
    ((True, None), "http://127.0.0.1:8080/", False),  # http lets the scheme through, not the address
    ((False, "127.0.0.1"), "http://127.0.0.1:8080/", False),  # ...and the allow-list not the scheme
    ((False, "127.0.0.1"), "https://127.0.0.1:8080/", True),
    ((False, "10.8.0.0/16"), "https://10.8.3.4/", True),
    ((False, "10.8.0.0/16"), "https://10.9.0.1/", False),
    ((False, "10.8.0.0/16"), "https://[::ffff:10.8.3.4]/", True),
    ((False, "fd00::/8"), "https://[fd12::1]/", True),
    ((False, "hooks.internal"), "https://HOOKS.internal./x", True),
    ((False, "hooks.internal"), "https://other.internal/x", True),  # a name: refused only once it resolves
    ((False, "localhost, 192.168.0.0/16"), "https://192.168.7.7/", True),
])
def test_the_operator_lets_chosen_schemes_hosts_and_networks_through(flags, url, allowed):
    policy = WebhookPolicy.from_flags(*flags)
    if allowed:
        policy.check_url(url)
    else:
        with pytest.raises(WebhookRefusedError):
            policy.check_url(url)


@pytest.mark.parametrize("entry, words", [
    ("10.0.0.1/8", ["'10.0.0.1/8' is not an address or network", "has host bits set"]),
    ("999.1.1.1", ["is not an address or network"]),
    ("*.example.com", ["is not a host name", "no wildcards"]),
    ("http://hooks.internal", ["is not a host name"]),
])
def test_a_bad_allow_list_entry_says_what_is_wrong(entry, words):
    with pytest.raises(ValueError) as err:
        WebhookPolicy.from_flags(False, f"localhost,{entry}")
    assert all(word in str(err.value) for word in words), str(err.value)


def test_a_bad_allow_list_stops_the_gateways_settings():
    with pytest.raises(ValueError, match="--webhook-allow-hosts"):
        settings("redis://127.0.0.1:1/0", webhook_allow_hosts="*.internal")


NOT_PUBLIC = [ipaddress.ip_network(n) for n in ("0.0.0.0/8", "10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16",
                                                 "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")]


@st.composite
def not_public(draw) -> ipaddress.IPv4Address:
    network = draw(st.sampled_from(NOT_PUBLIC))
    return network[draw(st.integers(0, network.num_addresses - 1))]


@given(not_public())
def test_no_form_of_a_non_public_ipv4_address_gets_through(address):
    forms = [str(address), f"[::ffff:{address}]", f"[{ipaddress.IPv6Address(0x2002 << 112 | int(address) << 80)}]",
             f"[{ipaddress.IPv6Address(int(ipaddress.IPv6Address('64:ff9b::')) | int(address))}]"]
    for form in forms:
        with pytest.raises(WebhookRefusedError, match="only public addresses"):
            STRICT.check_url(f"https://{form}/hook")
    allowed = WebhookPolicy.from_flags(False, f"{address}/32")
    assert allowed.check_url(f"https://{address}/hook").literal == address


@given(st.integers(0, 2**32 - 1))
def test_an_ipv4_address_and_its_ipv6_mapped_form_are_judged_alike(number):
    address = ipaddress.IPv4Address(number)
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert (refusal(address) is None) == (refusal(mapped) is None)


@given(st.text(max_size=80))
def test_any_text_is_either_refused_with_a_message_or_an_https_url_to_a_host(text):
    try:
        target = STRICT.check_url(text)
    except WebhookRefusedError as err:
        assert err.message.startswith("`webhook`")
        return
    assert target.url.scheme == "https" and target.host and not target.url.userinfo


@pytest.mark.parametrize("url, logged", [
    ("https://hooks.example.com/services/T0/B0/SECRET?token=abc", "https://hooks.example.com"),
    ("http://127.0.0.1:9000/hook?sig=x#f", "http://127.0.0.1:9000"),
    ("https://user:pw@hooks.example.com/", "https://hooks.example.com"),
    ("https://[::1]:8443/x", "https://[::1]:8443"),
])
def test_logs_name_a_webhook_by_scheme_host_and_port_only(url, logged):
    assert loggable(url) == logged


# -- over HTTP ---------------------------------------------------------------------------------------

def gateway(redis_url: str, **fields) -> Server:
    return Server(settings(redis_url, webhook_secret=SECRET, webhook_sweep_seconds=0.2, **fields))


def post_job(server: Server, webhook: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/jobs", json={"model": NULL, "input": "x", "webhook": webhook}, timeout=30)


def test_urls_that_are_not_public_are_refused_at_submit_and_nothing_is_sent(redis_url, redis_client, receiver):
    port = receiver.port
    refused = {  # URL -> what the answer must say
        receiver.url: "must be an https URL",
        f"https://127.0.0.1:{port}/hook": "loopback address",
        f"https://localhost:{port}/hook?token=t": "host localhost resolves to",  # /etc/hosts: no DNS query
        f"https://[::ffff:127.0.0.1]:{port}/hook": "loopback address",
        f"https://127.1:{port}/hook": "legacy form",
        "https://10.0.0.1/hook": "private address",
        "https://172.16.5.4/hook": "private address",
        "https://192.168.0.10/hook": "private address",
        "https://169.254.169.254/latest/meta-data": "link-local address",
        "https://[fe80::1]/hook": "link-local address",
        "https://[fc00::1]/hook": "private address",
        "https://[::1]/hook": "loopback address",
        "https://0.0.0.0/hook": "unspecified address",
        "https://[::]/hook": "unspecified address",
        "https://224.0.0.1/hook": "multicast address",
        "https://user:pw@127.0.0.1/hook": "must not carry credentials",
    }
    server = gateway(redis_url, webhook_allow_http=True)
    plain = gateway(redis_url)
    try:
        with null_worker(redis_url):
            answers = {url: post_job(plain if url == receiver.url else server, url) for url in refused}
    finally:
        server.stop()
        plain.stop()
    for url, words in refused.items():
        answer = answers[url]
        assert answer.status_code == 400, (url, answer.text)
        error = answer.json()["error"]
        assert error["param"] == "webhook" and words in error["message"], (url, error["message"])
    assert redis_client.llen("rq:queue:" + keys.queue_name(NULL)) == 0  # no job was enqueued for any
    assert redis_client.zcard(keys.WEBHOOKS_KEY) == 0
    assert receiver.connections == 0 and receiver.requests == []


def test_a_host_that_resolves_to_loopback_is_refused_at_connect_and_nothing_is_sent(redis_url, redis_client,
                                                                                      receiver, caplog):
    """A replica that allows `localhost` accepts the job; the replica that delivers it does not, and finds
    at connect time that the name resolves to loopback: the webhook leaves the delivery list unsent."""
    caplog.set_level(logging.WARNING, logger="embedfleet.producer.gateway.jobs.webhooks")
    webhook = f"http://localhost:{receiver.port}/hook?token=s3cr3t"
    with null_worker(redis_url) as worker:
        accepting = gateway(redis_url, webhook_allow_http=True, webhook_allow_hosts="localhost")
        try:
            answer = post_job(accepting, webhook)
        finally:
            accepting.stop()
        assert answer.status_code == 202, answer.text
        job = answer.json()["id"]
        worker.serve()
        delivering = gateway(redis_url, webhook_allow_http=True)
        try:
            deadline = time.monotonic() + 30
            while redis_client.zscore(keys.WEBHOOKS_KEY, job) is not None:  # off the list: decided
                assert time.monotonic() < deadline, "the webhook was never looked at"
                time.sleep(0.05)
        finally:
            delivering.stop()
    assert receiver.connections == 0 and receiver.requests == []
    [record] = [r for r in caplog.records if job in r.getMessage()]
    message = record.getMessage()
    assert "not sent" in message and "resolves to" in message and "loopback address" in message, message
    assert f"http://localhost:{receiver.port}" in message and "s3cr3t" not in caplog.text and "/hook" not in message


def test_an_allowed_host_name_gets_its_webhook_through_the_address_it_was_checked_at(redis_url, receiver):
    """Allowed by name: the gateway resolves `localhost` itself and connects to an address it resolved
    (::1 or 127.0.0.1, whichever the receiver listens on), with the name in the Host header."""
    webhook = f"http://localhost:{receiver.port}/hook?token=t"
    server = gateway(redis_url, webhook_allow_http=True, webhook_allow_hosts="localhost")
    try:
        with null_worker(redis_url) as worker:
            worker.serve()
            answer = post_job(server, webhook)
            assert answer.status_code == 202, answer.text
            [delivery] = receiver.wait_for(1)
    finally:
        server.stop()
    assert delivery["headers"]["Host"] == f"localhost:{receiver.port}" and delivery["path"] == "/hook?token=t"
    assert json.loads(delivery["body"])["id"] == answer.json()["id"]
