"""A load of one-text requests on the model "hashed" (tests/hashed.py) that spans a change of a Redis Cluster's
masters (a failover, a resharding): at most WINDOW unanswered, every accepted one waited for."""

from __future__ import annotations

import threading

from embedfleet import Producer
from embedfleet.common.errors import EmbedfleetError
from tests.hashed import MODEL

FAILOVER_AFTER = 60  # accepted requests before the failover starts
AFTER_FAILOVER = 60  # submits once the replica took over
MAX_REQUESTS = 3000  # the submits stop by themselves even if the failover never ends
WINDOW = 16  # requests unanswered at most


class Load(threading.Thread):
    """Submits one-text requests with at most WINDOW unanswered (paced by the worker, so the load spans the
    failover), until AFTER_FAILOVER more were accepted after `failed_over` (MAX_REQUESTS at most); then waits
    for every accepted one. A submit may fail with a clear error (a code); an accepted request unanswered is
    lost."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.accepted: list[str] = []
        self.answers: dict[str, tuple] = {}
        self.refused: list[EmbedfleetError] = []
        self.started, self.failed_over = threading.Event(), threading.Event()

    def run(self) -> None:
        with Producer(self.url) as producer:
            after = 0
            for index in range(MAX_REQUESTS):
                try:
                    self.accepted.append(producer.submit([f"text {index}"], MODEL))
                except EmbedfleetError as exc:
                    self.refused.append(exc)
                if len(self.accepted) - len(self.answers) >= WINDOW:
                    self._answer(producer, self.accepted[len(self.answers)])
                if len(self.accepted) >= FAILOVER_AFTER:
                    self.started.set()
                after += self.failed_over.is_set()
                if after >= AFTER_FAILOVER:
                    break
            self.started.set()
            for request_id in self.accepted[len(self.answers):]:
                self._answer(producer, request_id)

    def _answer(self, producer: Producer, request_id: str) -> None:
        self.answers[request_id] = producer.wait(request_id, timeout=60).embeddings.shape
