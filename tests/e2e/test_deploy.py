"""What docker-compose.yml and the Dockerfile run is real: the compose file is valid for each profile (Debian's
docker-compose parses it, no engine needed), every `embedfleet` command, flag and EMBEDFLEET_ variable they
pass exists in the CLI, and the pieces compose relies on work: `worker --gpus`, `health --worker/--gateway`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import redis
import yaml

from embedfleet.common.codec import unpackb
from embedfleet.common.protocol import keys
from embedfleet.common.redisserver import free_port
from tests.commands import ROOT, assert_one_line_error, clean_env, embedfleet
from tests.secureredis import embedfleet_process, stop
from tests.systemtools import need

PROFILES = {"cpu": "worker", "gpu": "worker-gpu"}


def compose_config(profile: str) -> dict:
    need("docker-compose", untested="docker-compose.yml")
    done = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "--profile", profile,
                           "config"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "REDIS_PASSWORD": "0123abcd"})
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_compose_profile_is_valid_and_complete(profile):
    config = compose_config(profile)
    services = config["services"]
    worker = services[PROFILES[profile]]
    assert worker["profiles"] == [profile] and "profiles" not in services["gateway"]
    assert worker["build"]["args"]["TORCH_INDEX"].endswith("/cpu" if profile == "cpu" else "/cu128")
    for name in ("gateway", PROFILES[profile]):
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}
        assert services[name]["healthcheck"]["test"][:3] == ["CMD", "embedfleet", "health"]
        assert "0123abcd@redis:6379" in services[name]["environment"]["EMBEDFLEET_REDIS_URL"]
    assert _seconds(worker["stop_grace_period"]) >= 30 + 10  # a 30 s drain and some margin
    redis_service = services["redis"]
    assert "--appendonly yes" in " ".join(redis_service["command"]) and "requirepass" in " ".join(
        redis_service["command"])
    assert redis_service["environment"]["REDISCLI_AUTH"] == "0123abcd" and redis_service["healthcheck"]
    if profile == "gpu":
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["count"] == "all" and worker["command"][-2:] == ["--gpus", "all"]
    else:
        assert "deploy" not in worker  # a CPU host reserves no GPU


def test_compose_refuses_to_run_redis_without_a_password():
    need("docker-compose", untested="docker-compose.yml's REDIS_PASSWORD check")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_PASSWORD"}
    done = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode != 0 and "REDIS_PASSWORD" in done.stderr


def _seconds(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    found = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", value)
    return int(found.group(1) or 0) * 60 + int(found.group(2) or 0)


def _embedfleet_commands() -> list[tuple[str, list[str], list[str]]]:
    """(where, argv after `embedfleet`, EMBEDFLEET_ variables) for everything compose and the Dockerfile run."""
    found = []
    for profile in sorted(PROFILES):
        for name, service in compose_config(profile)["services"].items():
            env = [k for k in service.get("environment", {}) if k.startswith("EMBEDFLEET_")]
            for what, argv in (("command", service.get("command")),
                               ("healthcheck", (service.get("healthcheck") or {}).get("test", [])[1:])):
                if argv and argv[0] == "embedfleet":
                    found.append((f"compose {profile} {name} {what}", argv[1:], env if what == "command" else []))
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith(("CMD ", "HEALTHCHECK ")):
            argv = json.loads(line.split(" ", 1)[1].removeprefix("CMD "))
            if argv[0] == "embedfleet":
                found.append((f"Dockerfile {line}", argv[1:], []))
    return found


def test_every_command_flag_and_variable_that_compose_and_the_dockerfile_pass_exists(tmp_path):
    commands = _embedfleet_commands()
    assert {argv[0] for _, argv, _ in commands} >= {"worker", "gateway", "health"}
    helps = {}  # one run per distinct command line: compose's profiles and the Dockerfile repeat the same few
    for where, argv, env in commands:
        if tuple(argv) not in helps:
            helps[tuple(argv)] = embedfleet(*argv, "--help", env=clean_env(tmp_path))
        done = helps[tuple(argv)]
        assert done.returncode == 0, f"{where}: {done.stderr}"
        text = " ".join(done.stdout.split())  # argparse wraps its help
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(flag)}[\s,]", text), f"{where}: unknown flag {flag}"
        for variable in env:  # EMBEDFLEET_MAX_JOBS is --max-jobs (the help says so once, at its end)
            flag = "--" + variable.removeprefix("EMBEDFLEET_").lower().replace("_", "-")
            assert re.search(rf"(^|\s){re.escape(flag)}[\s,]", text), f"{where}: {variable} is not a setting of " \
                                                                     f"`{argv[0]}`"
    # The check itself: an unknown flag or variable is caught.
    done = embedfleet("worker", "--no-such-flag", "--help", env=clean_env(tmp_path))
    assert "--no-such-flag" not in done.stdout


def test_worker_gpus_starts_one_engine_per_gpu_and_health_sees_them(redis_url, tmp_path):
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url)
    parent = embedfleet_process("worker", "--gpus", "0,1", "--model", "null:4", "--served-model-name", "gpus",
                                env=env)
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 90
        while client.zcard(keys.model_workers_key("gpus")) < 2:
            assert parent.poll() is None, stop(parent)[-2000:]
            assert time.monotonic() < deadline, "two engines never advertised"
            time.sleep(0.2)
        names = [n.decode() for n in client.zrange(keys.model_workers_key("gpus"), 0, -1)]
        facts = [unpackb(client.get(keys.worker_info_key(n))) for n in names]
        assert sorted(f["cuda_visible_devices"] for f in facts) == ["0", "1"]
        assert len({f["pid"] for f in facts}) == 2 and parent.pid not in {f["pid"] for f in facts}
        healthy = embedfleet("health", "--worker", "--model", "gpus", env=env)
        assert healthy.returncode == 0 and "healthy: worker" in healthy.stdout, healthy.stderr
        parent.send_signal(signal.SIGTERM)  # forwarded: both engines stop, then the parent, with 0
        assert parent.wait(60) == 0
        assert client.zcard(keys.model_workers_key("gpus")) == 0
    finally:
        stop(parent)
        client.close()
    assert_one_line_error(embedfleet("health", "--worker", "--model", "gpus", env=env), 1, "unhealthy",
                          "no live worker on host")


def test_worker_gpus_all_without_a_gpu_says_so(redis_url, tmp_path):
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url, CUDA_VISIBLE_DEVICES="")
    assert_one_line_error(embedfleet("worker", "--gpus", "all", "--model", "null:4", env=env), 1,
                          "no GPU is visible")


def test_health_gateway(redis_url, tmp_path):
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url)
    port = free_port()
    assert_one_line_error(embedfleet("health", "--gateway", "--url", f"http://127.0.0.1:{port}", env=env), 1,
                          "does not answer")
    gateway = embedfleet_process("gateway", "--port", str(port), env=env)
    try:
        deadline = time.monotonic() + 30
        while True:  # no worker: /health is 503, and so is the healthcheck, with the reason
            done = embedfleet("health", "--gateway", "--url", f"http://127.0.0.1:{port}", env=env)
            if "answered /health with 503" in done.stderr:
                break
            assert time.monotonic() < deadline and gateway.poll() is None, done.stderr
            time.sleep(0.3)
        assert_one_line_error(done, 1, "no_worker")
        assert_one_line_error(embedfleet("health", env=env), 2, "exactly one of --worker and --gateway")
    finally:
        stop(gateway)


@pytest.mark.timeout(900)  # worker starts on a CPU that may be busy: a bound against a hang only
def test_the_capacity_command_prints_the_benchmarks_table(tmp_path):
    """BENCHMARKS.md's capacity table comes from bench/capacity.py: same columns, and the command measures the
    whole path (the producer's wait included) beside the raw loop."""
    out = tmp_path / "capacity.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "capacity.py"), "--rows", "raw,sync,async",
                           "--requests", "100", "--sync-requests", "40", "--requests-64", "20", "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=clean_env(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    header = next(line for line in done.stdout.splitlines() if line.startswith("| path "))
    documented = [line.split() for line in (ROOT / "BENCHMARKS.md").read_text().splitlines()
                  if line.startswith("| path ") and "producer round trips/request" in line]
    assert documented and all(words == header.split() for words in documented)  # padding aside
    rows = json.loads(out.read_text())
    assert set(rows) == {"raw loop, 1 text, one at a time", "raw loop, 64 texts, one at a time",
                         "sync, 1 text, one at a time", "async, 1 text, in flight", "async, 64 texts, in flight",
                         "async, 64 texts, in flight, embed_dtype float16",
                         "async, 64 texts, in flight, embed_dtype binary"}
    assert abs(rows["raw loop, 1 text, one at a time"]["commands"] - 6) < 0.1  # what the loop sends
    for r in rows.values():
        assert r["redis_cpu_us"] > 0 and 5 <= r["commands"] < 200 and r["producer_round_trips"] > 0
