"""build_worker (worker/serving/builder.py), the one way a worker is built, by `embedfleet worker` and by the tests'
harness: every policy comes from the settings, and what production does (the vector cache, the watchdog, long
requests spread over the fleet) a built worker does unless a caller overrides it. Real Redis, tiny models."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import harness
from tests.nullworker import null_engine
from tests.tinymodels import engine_for
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.serving import builder
from embedfleet.worker.serving.builder import PER_TOKEN, build_worker, per_token
from embedfleet.worker.serving.cache import VectorCache
from embedfleet.worker.serving.config import WorkerSettings, given_settings
from embedfleet.worker.serving.pipeline import BatchWorker

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {name: field.default for name, field in WorkerSettings.model_fields.items()}


@pytest.fixture
def built(monkeypatch) -> dict:
    """What build_worker hands BatchWorker, recorded in place of building it."""
    seen: dict = {}

    def record(engine, connection, **kwargs):
        seen.update(kwargs)
        return SimpleNamespace(**kwargs)

    monkeypatch.setattr(builder, "BatchWorker", record)
    return seen


def test_every_policy_comes_from_the_settings(bert_mean, redis_client, built):
    settings = given_settings(max_jobs=7, result_ttl=99, poll_timeout=2, lease_seconds=3.0, max_deliveries=4,
                              drain_timeout=5.0, name="named", bulk_share=3, chunks_per_job=9, rq_records="full",
                              watchdog_seconds=11.0, watchdog_per_token=0.5, cache_ttl=123)
    build_worker(settings, engine_for(bert_mean), redis_client)
    assert {name: built[name] for name in ("max_jobs", "result_ttl", "poll_timeout", "lease", "max_deliveries",
                                           "drain_timeout", "name", "bulk_share", "chunks_per_job", "rq_records")} == {
        "max_jobs": 7, "result_ttl": 99, "poll_timeout": 2, "lease": 3.0, "max_deliveries": 4, "drain_timeout": 5.0,
        "name": "named", "bulk_share": 3, "chunks_per_job": 9, "rq_records": "full"}
    assert built["watchdog"] == (11.0, 0.5) and built["metrics"] is None  # no --metrics-port
    cache = built["cache"]
    assert isinstance(cache, VectorCache) and cache.ttl == 123 and cache.connection is redis_client
    engine = engine_for(bert_mean)
    assert cache.identity == model_identity(engine.caps.name, folder_digest(bert_mean), "float32", "cpu")


def test_a_worker_built_from_the_defaults_does_what_production_does(bert_mean, redis_client):
    worker = build_worker(given_settings(), engine_for(bert_mean), redis_client)
    assert worker.steps.cache is not None and worker.inflight is not None  # the vector cache, in-flight dedup
    assert worker.steps.chunks_per_job == worker.chunk_jobs.chunks_per_job == DEFAULTS["chunks_per_job"] > 0
    watchdog = worker.forwarding.watchdog
    assert (watchdog.floor, watchdog.per_token) == (DEFAULTS["watchdog_seconds"], PER_TOKEN)
    assert (worker.taking.max_jobs, worker.result_ttl, worker.levels.share, worker.levels.records) == (
        DEFAULTS["max_jobs"], DEFAULTS["result_ttl"], DEFAULTS["bulk_share"], DEFAULTS["rq_records"])


def test_the_null_model_and_no_cache_build_no_cache(bert_mean, redis_client, built):
    build_worker(given_settings(), null_engine(), redis_client)
    assert built["cache"] is None  # the null model computes nothing worth caching
    build_worker(given_settings(cache=False), engine_for(bert_mean), redis_client)
    assert built["cache"] is None


def test_overrides_replace_what_the_settings_make(bert_mean, redis_client, built):
    own = VectorCache(redis_client, "a" * 32, 32)
    build_worker(given_settings(), engine_for(bert_mean), redis_client, cache=own, watchdog=None,
                 heartbeat_interval=0.2, info={"device": "cpu"})
    assert built["cache"] is own and built["watchdog"] is None
    assert built["heartbeat_interval"] == 0.2 and built["info"] == {"device": "cpu"}


def test_the_watchdogs_seconds_per_token_come_from_the_flag_else_the_probe():
    probed = SimpleNamespace(texts_per_s={16: 100.0, 128: 20.0})  # 1,600 and 2,560 padded tokens/s
    assert per_token(None, probed) == 10.0 / 1600
    assert per_token(0.5, probed) == 0.5
    assert per_token(None, None) == per_token(None, SimpleNamespace(texts_per_s={})) == PER_TOKEN


def test_the_tests_settings_read_neither_the_environment_nor_a_running_up(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_MAX_JOBS", "3")
    monkeypatch.setenv("EMBEDFLEET_REDIS_URL", "redis://elsewhere:6399/0")
    assert WorkerSettings().max_jobs == 3  # what `embedfleet worker` would read
    settings = harness.settings(result_ttl=5)
    assert (settings.max_jobs, settings.redis_url, settings.result_ttl) == (DEFAULTS["max_jobs"], None, 5)


def test_batchworker_has_no_policy_defaults_of_its_own():
    """The settings hold every default: BatchWorker takes each policy it shares with them as a required argument."""
    named = {"lease": "lease_seconds"}
    parameters = inspect.signature(BatchWorker.__init__).parameters
    shared = [name for name in parameters if named.get(name, name) in WorkerSettings.model_fields]
    assert {"max_jobs", "lease", "chunks_per_job", "cache"} <= set(shared)
    assert [name for name in shared if name != "name" and parameters[name].default is not inspect.Parameter.empty] \
        == []
    assert parameters["watchdog"].default is inspect.Parameter.empty


def test_only_the_builder_builds_a_batchworker():
    """`embedfleet worker`, the benchmarks and the tests build their workers with build_worker (the tests through
    tests/harness.py): no other BatchWorker(...) in the tree."""
    callers = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in {".venv", "build", "dist"} or relative.parts[0].endswith(".egg-info"):
            continue  # installed and built copies
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) \
                    == "BatchWorker":
                callers.append(str(relative))
    assert callers == ["worker/serving/builder.py"]
