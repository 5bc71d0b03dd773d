"""EMBEDFLEET_ env vars as compose files set them: an empty one is an unset one for every setting of every entry
point, a list reads as its flag does, and a bad value is refused in one line that names the variable (or the
flag) the user has to fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from embedfleet.common.config import ENV_PREFIX
from embedfleet import Producer
from embedfleet.producer.cli.bulk import EmbedFileSettings
from embedfleet.producer.cli.failed import FailedSettings
from embedfleet.producer.cli.health import HealthSettings
from embedfleet.producer.cli.statusview import StatusSettings
from embedfleet.producer.cli.upsettings import UpSettings
from embedfleet.producer.gateway.settings import GatewaySettings
from tests.commands import ROOT, advertised, assert_one_line_error, clean_env
from embedfleet.worker.engine import cpus
from embedfleet.worker.serving.config import WorkerSettings

ENTRY_POINTS = [WorkerSettings, GatewaySettings, UpSettings, EmbedFileSettings, StatusSettings, FailedSettings,
                HealthSettings]


@pytest.fixture
def no_settings_env(monkeypatch, tmp_path):
    """No EMBEDFLEET_ variable of the user's, and no running `up` of theirs to discover."""
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return monkeypatch


@pytest.mark.parametrize("settings", ENTRY_POINTS, ids=lambda cls: cls.__name__)
def test_every_empty_variable_means_unset(settings, no_settings_env):
    """A compose file's `EMBEDFLEET_X: ${X:-}` lines, all of them empty, change nothing."""
    unset = settings().model_dump()
    for name in settings.model_fields:
        no_settings_env.setenv(ENV_PREFIX + name.upper(), "")
    assert settings().model_dump() == unset


def test_a_list_variable_reads_as_its_flag(no_settings_env):
    no_settings_env.setenv("EMBEDFLEET_MATRYOSHKA_DIMS", "64, 128")
    assert WorkerSettings().matryoshka_dims == [64, 128]
    no_settings_env.setenv("EMBEDFLEET_MATRYOSHKA_DIMS", "[32,64]")  # JSON, as pydantic-settings reads it
    assert WorkerSettings().matryoshka_dims == [32, 64]


def run(module: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)


def test_a_bad_variable_is_named_in_the_one_line_error(tmp_path):
    env = clean_env(tmp_path / "cache", EMBEDFLEET_THREADS="lots", EMBEDFLEET_MAX_JOBS="0")
    done = run("worker", "--redis-url", "redis://127.0.0.1:1/0", env=env)
    assert_one_line_error(done, 2, "EMBEDFLEET_THREADS: Input should be a valid integer",
                          "EMBEDFLEET_MAX_JOBS: Input should be greater than or equal to 1")
    flag = run("worker", "--redis-url", "redis://127.0.0.1:1/0", "--max-jobs", "0", env=clean_env(tmp_path / "cache"))
    assert_one_line_error(flag, 2, "--max-jobs: Input should be greater than or equal to 1")
    gateway = run("embedfleet.producer.gateway", "--redis-url", "redis://127.0.0.1:1/0",
                  env=clean_env(tmp_path / "cache", EMBEDFLEET_MAX_IN_FLIGHT="none"))
    assert_one_line_error(gateway, 2, "EMBEDFLEET_MAX_IN_FLIGHT: Input should be a valid integer")


def test_a_real_worker_starts_with_an_empty_threads_line(tmp_path, redis_url):
    """EMBEDFLEET_THREADS="" (an empty compose line) used to stop the worker with a usage error; it is unset."""
    env = clean_env(tmp_path / "cache", EMBEDFLEET_THREADS="", EMBEDFLEET_MAX_BATCH_SIZE="",
                    EMBEDFLEET_METRICS_PORT="", EMBEDFLEET_QUANTIZE="", EMBEDFLEET_BURST="")
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", "null:8",
                               "--served-model-name", "null", "--poll-timeout", "1"],
                              env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        with Producer(redis_url) as producer:
            info = advertised(producer, "null", worker)
        auto = cpus.decide(None, cpus.affinity(), cpus.cgroup_quota())
        assert (info["threads"], info["threads_source"]) == (auto.count, auto.source)
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
