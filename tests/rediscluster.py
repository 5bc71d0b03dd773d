"""A real local Redis Cluster of a test's own: N masters (and replicas) of redis-server on free loopback ports
in a temp dir, joined by `redis-cli --cluster create`, ready once every node says cluster_state:ok."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from embedfleet.common.redisserver import RedisServer, free_port
from tests.systemtools import need

READY_TIMEOUT = 30.0


class LocalCluster:
    """`masters` masters with `replicas` replicas each; `url` is its redis+cluster:// URL (every master a
    seed). Use as a context manager; `servers` are the nodes in the order `redis-cli --cluster create` got
    them (masters first)."""

    def __init__(self, folder: Path, masters: int = 3, replicas: int = 0):
        self.folder = Path(folder)
        self.masters, self.replicas = masters, replicas
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:self.masters])

    def start(self) -> LocalCluster:
        need("redis-cli", untested="Redis Cluster")
        for index in range(self.masters * (1 + self.replicas)):
            node = self.folder / f"node-{index}"
            node.mkdir(parents=True, exist_ok=True)
            (node / "redis.conf").write_text(
                "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 2000\n"
                "cluster-replica-validity-factor 0\nrepl-diskless-sync-delay 0\n"
                f"cluster-port {free_port()}\n")  # the bus on a free port of its own (not port + 10000)
            self.servers.append(RedisServer(node / "data", config_file=node / "redis.conf").start())
        addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas),
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every live node says cluster_state:ok and knows all masters and replicas, and every replica
        has synced with its master (a manual failover waits for that)."""
        deadline = time.monotonic() + timeout
        while True:
            states = [self._state(server) for server in self.live()]
            if all(state == "ok" for state in states):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster is not ready after {timeout} s: {states}")
            time.sleep(0.1)

    def _state(self, server: RedisServer) -> str:
        with redis.Redis(port=server.port, socket_timeout=2) as client:
            state = client.cluster("INFO")["cluster_state"]
            nodes = client.cluster("NODES")
            link = client.info("replication").get("master_link_status", "up")  # a replica: synced with its master
        known = [n for n in nodes.values() if "handshake" not in n["flags"] and "noaddr" not in n["flags"]]
        if len(known) != len(self.servers):
            return f"{state} ({len(known)} nodes known)"
        return state if link == "up" else f"{state} (replica link {link})"

    def live(self) -> list[RedisServer]:
        return [s for s in self.servers if s.process and s.process.poll() is None]

    def role(self, server: RedisServer) -> str:
        with redis.Redis(port=server.port, socket_timeout=2) as client:
            return client.execute_command("ROLE")[0].decode()

    def master_ports(self) -> list[int]:
        return [s.port for s in self.live() if self.role(s) == "master"]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
