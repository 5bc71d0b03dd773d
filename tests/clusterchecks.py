"""What the Redis Cluster tests compare: TEXTS embedded through a cluster and through one plain Redis, the rows'
cosines, and the keys each master holds."""

from __future__ import annotations

import numpy as np
import redis

TEXTS = ["Redis Cluster spreads slots over masters.", "A hash tag keeps a queue in one slot.", "short"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def keys_by_master(cluster) -> dict[int, list[bytes]]:
    found = {}
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            found[port] = list(client.scan_iter(count=1000))
    return found
