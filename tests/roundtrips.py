"""A Redis connection that counts the round trips a client makes over it."""

from __future__ import annotations

import redis


class CountingConnection(redis.Connection):
    """A real connection that counts round trips (one send per command or pipeline), not the handshakes
    of new pool connections, whose number depends on the pool's history rather than on the jobs."""

    sends = 0
    _handshaking = False

    def on_connect(self):
        self._handshaking = True
        try:
            super().on_connect()
        finally:
            self._handshaking = False

    def send_packed_command(self, command, check_health=True):
        CountingConnection.sends += not self._handshaking
        return super().send_packed_command(command, check_health)
