"""The commands while one partition of a model is down (docs/capacity.md, "A partition whose Redis is down"):
`embedfleet status` shows the partition that answers and names the one that does not (redacted), --json marks it,
`embedfleet embed` completes on the live one and says which it left out, `health --worker` names it; a down
default Redis stays fatal."""

from __future__ import annotations

import json

import numpy as np

from embedfleet.common.redisserver import RedisServer
from tests.commands import clean_env, embedfleet
from tests.nullworker import NULL, null_worker

PASSWORD = "partition-secret"  # any password passes `default`'s nopass, and must not be printed


def test_status_and_embed_go_on_without_a_partition(tmp_path):
    with RedisServer(tmp_path / "live") as live, RedisServer(tmp_path / "down") as down:
        down_url = f"redis://default:{PASSWORD}@127.0.0.1:{down.port}/0"
        shown_url = f"redis://default:***@127.0.0.1:{down.port}/0"
        env = clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=live.url,
                        EMBEDFLEET_REDIS_SHARDS=f"{NULL}={live.url},{down_url}")
        with null_worker(live.url) as first, null_worker(down_url) as second:
            first.serve()
            second.serve()
            both = json.loads(embedfleet("status", "--json", env=env).stdout)
            assert both["models"][0]["live_workers"] == 2 and both["unreachable"] == []
            down.stop()

            table = embedfleet("status", env=env)
            assert table.returncode == 0, table.stderr
            shown = " ".join(table.stdout.split())  # (rich folds lines at 80 columns)
            named = f"partition 2 of 2 of model '{NULL}' (Redis {shown_url}) is unreachable ("
            assert shown.count("partition 2 of 2") == 1 and named in shown, table.stdout
            assert "workers" in table.stdout and f"{NULL}" in table.stdout  # the live partition's rows
            assert PASSWORD not in table.stdout + table.stderr

            done = embedfleet("status", "--json", env=env)
            assert done.returncode == 0, done.stderr
            fleet = json.loads(done.stdout)
            (row,) = fleet["models"]
            assert row["name"] == NULL and row["live_workers"] == 1 and row["redis"] == live.url
            (marker,) = fleet["unreachable"]
            assert {k: marker[k] for k in ("model", "partition", "of", "url")} == {
                "model": NULL, "partition": 2, "of": 2, "url": shown_url}
            assert "refused" in marker["error"].lower() and PASSWORD not in done.stdout

            source, out = tmp_path / "texts.txt", tmp_path / "vectors.npy"
            source.write_text("".join(f"text {i}\n" for i in range(12)))
            embedded = embedfleet("embed", str(source), str(out), env=env)
            assert embedded.returncode == 0, embedded.stderr
            assert np.load(out).shape == (12, 4)
            assert "partition 2 of 2" in embedded.stderr and shown_url in embedded.stderr, embedded.stderr
            assert PASSWORD not in embedded.stdout + embedded.stderr

            anywhere = embedfleet("health", "--worker", "--any-host", "--model", NULL, env=env)
            assert anywhere.returncode == 0 and f"on {live.url}" in anywhere.stdout, anywhere.stderr
            here = embedfleet("health", "--worker", "--model", NULL, env=env)  # a null worker names no host
            assert here.returncode == 1 and "no live worker on host" in here.stderr, here.stderr
            assert "partition 2 of 2" in here.stderr and shown_url in here.stderr and PASSWORD not in here.stderr
            assert embedfleet("failed", "list", env=env).returncode == 0  # (it reads the default Redis)
            down.start()  # back before the workers stop: the stopped one's worker withdraws as usual


def test_a_down_default_redis_is_still_fatal(tmp_path):
    with RedisServer(tmp_path / "default") as default, RedisServer(tmp_path / "other") as other:
        env = clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=default.url,
                        EMBEDFLEET_REDIS_SHARDS=f"{NULL}={default.url},{other.url}")
        default.stop()
        done = embedfleet("status", "--json", env=env)
        assert done.returncode == 1 and "unreachable" in done.stderr and not done.stdout, done.stderr
