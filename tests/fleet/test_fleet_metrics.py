"""Metrics for scaling (issue #10): the worker's Prometheus endpoint and the gateway's fleet gauges parse
with prometheus_client's own parser and move when work is done. Real Redis, a real BatchWorker on a tiny
random BERT (inputs of different lengths, so padding is real), a real uvicorn gateway, real HTTP."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.protocol import keys
from embedfleet.common.redisserver import free_port
from embedfleet import Producer
from tests.commands import ROOT, clean_env
from tests.gatewayserver import Server, settings
from tests.harness import burst, idle_worker
from tests.commands import wait_for
from tests.tinymodels import bert_mean, engine_for  # noqa: F401 - `bert_mean` is a fixture
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.serving.metrics import WorkerMetrics
from embedfleet.worker.engine.models.nullmodel import NullModel


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus text page, read by prometheus_client's parser."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_worker_metrics_parse_and_move_when_work_is_done(bert_mean, redis_client, redis_url):  # noqa: F811
    engine = engine_for(bert_mean)
    model = engine.caps.name
    metrics = WorkerMetrics(model)
    port = free_port()
    metrics.serve(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    worker = idle_worker(engine, redis_client, metrics=metrics)  # the requests queue up: one burst serves them
    before = scrape(url)
    assert value(before, "embedfleet_worker_batches_total", model=model) == 0

    texts = ["short", "a somewhat longer text with a few more words in it", "mid length text here"]
    with Producer(redis_url) as producer:
        interactive = producer.submit_many([[t] for t in texts], model)
        bulk = producer.submit(texts, model, priority="bulk")
        late = producer.submit(["too late"], model, timeout=0.05)
        bad = producer.submit(["x" * 10], model)
        redis_client.hset(f"rq:job:{bad}", "data", b"not zlib")  # undecodable: fails alone, decode_error
        time.sleep(0.1)
        assert burst(worker)
        assert all(producer.wait(i, 10).ok for i in [*interactive, bulk])
        assert producer.status(late) == producer.status(bad) == "failed"

    after = scrape(url)
    rows = value(after, "embedfleet_worker_rows_total", model=model)
    assert rows == 6  # three interactive texts and the bulk request's three; the expired one never ran
    assert value(after, "embedfleet_worker_batches_total", model=model) >= 1
    assert value(after, "embedfleet_worker_rounds_total", model=model) >= 1
    real = value(after, "embedfleet_worker_tokens_total", model=model, kind="real")
    padded = value(after, "embedfleet_worker_tokens_total", model=model, kind="padded")
    assert 0 < real < padded  # different lengths in one pass: padding is counted
    assert value(after, "embedfleet_worker_forward_seconds_count", model=model) >= 1
    assert value(after, "embedfleet_worker_forward_seconds_sum", model=model) > 0
    waits = {p: value(after, "embedfleet_worker_queue_wait_seconds_count", model=model, priority=p)
             for p in ("interactive", "bulk")}
    assert waits == {"interactive": 4, "bulk": 1}  # every decoded request, the expired one too
    assert value(after, "embedfleet_worker_queue_wait_seconds_sum", model=model, priority="interactive") >= 0.05
    assert value(after, "embedfleet_worker_errors_total", model=model, code="expired") == 1
    assert value(after, "embedfleet_worker_errors_total", model=model, code="decode_error") == 1


@pytest.fixture
def gateway(redis_url):
    server = Server(settings(redis_url))
    try:
        yield server
    finally:
        server.stop()


def test_gateway_fleet_gauges_per_model_and_priority_move_with_the_queues(gateway, redis_client, redis_url):
    model = "gauged"
    engine = Engine(NullModel("null:4", model))
    worker = idle_worker(engine, redis_client)  # the queues fill while it is idle
    url = f"{gateway.url}/metrics"
    with Producer(redis_url) as producer:
        producer.submit_many([["a" * 40]] * 3, model, priority="bulk")
        producer.submit(["b" * 8, "c"], model)
        time.sleep(0.2)
        queued = scrape(url)
        for priority, depth, tokens in (("interactive", 1, 8 // 4 + 2 + 1 // 4 + 2), ("bulk", 3, 3 * (40 // 4 + 2))):
            labels = {"model": model, "priority": priority}
            assert value(queued, "embedfleet_level_queue_depth", **labels) == depth
            assert value(queued, "embedfleet_level_queued_tokens", **labels) == tokens
            assert value(queued, "embedfleet_level_oldest_age_seconds", **labels) >= 0.2
        assert value(queued, "embedfleet_queue_depth", model=model) == 4
        assert value(queued, "embedfleet_live_workers", model=model) == 1

        assert burst(worker)
        worker.advertiser.withdraw()
        drained = scrape(url)
        for priority in ("interactive", "bulk"):  # a model with no live worker is still reported (scale to zero)
            labels = {"model": model, "priority": priority}
            assert value(drained, "embedfleet_level_queue_depth", **labels) == 0
            assert value(drained, "embedfleet_level_queued_tokens", **labels) == 0
            assert (("embedfleet_level_oldest_age_seconds", tuple(sorted(labels.items()))) in drained
                    and value(drained, "embedfleet_level_oldest_age_seconds", **labels) == 0)
        assert value(drained, "embedfleet_live_workers", model=model) == 0
        assert redis_client.get(keys.queued_tokens_key(keys.queue_name(model, "bulk"))) is None


def test_a_worker_started_with_a_metrics_port_serves_them(redis_url, redis_client, tmp_path):
    """The flag end to end: `python -m embedfleet.worker --metrics-port` on the null model, scraped over HTTP; with
    no --metrics-host it listens on loopback only, as every listener of the project does by default."""
    import psutil

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", "null:4",
                             "--served-model-name", "flagged", "--metrics-port", str(port), "--poll-timeout", "1"],
                            cwd=ROOT, env=clean_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: redis_client.zcard(keys.model_workers_key("flagged")) >= 1, 60)
        listening = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}
        with Producer(redis_url) as producer:
            assert producer.embed(["one", "two"], "flagged", timeout=30).shape == (2, 4)
        wait_for(lambda: value(scrape(f"http://127.0.0.1:{port}/metrics"), "embedfleet_worker_rows_total",
                               model="flagged") == 2, 10)
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def test_the_keda_example_names_our_real_queue_and_gauges():
    import yaml

    from embedfleet.producer.gateway.core.metrics import Metrics

    docs = list(yaml.safe_load_all((ROOT / "deploy" / "keda-scaledobject.yaml").read_text()))
    triggers = [t for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    [redis_list] = [t["metadata"]["listName"] for t in triggers if t["type"] == "redis"]
    assert redis_list == f"rq:queue:{keys.queue_name('bge-m3', 'bulk')}"
    exported = {m.name for m in Metrics().registry.collect()}
    queried = [t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"]
    assert queried and all(any(f"{name}{{" in q for name in exported) for q in queried), queried
