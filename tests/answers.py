"""A model-free stand-in for a worker, for tests about the producer side: it advertises a model with the
real Advertiser and answers queued requests through the protocol's own publish (common/protocol/answering.py)."""

from __future__ import annotations

import numpy as np
import redis
from rq.job import Job

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import answering
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.worker.serving.advertise import Advertiser

MODEL = "stub"
CAPS = ModelCapabilities(name=MODEL, max_model_len=32, embedding_size=4, vocab_size=100)


def advertise(connection: redis.Redis) -> None:
    Advertiser(connection, CAPS, "stub-worker", ttl=3600).advertise()


def answer(connection: redis.Redis, request_ids: list[str]) -> None:
    """Store a result for each id (row i of request r holds r's index), as a worker would."""
    for request_id in request_ids:
        job = Job.fetch(request_id, connection=connection, serializer=MsgpackSerializer)
        request = EmbedRequest.decode(job.args[0])
        rows = np.full((len(request.inputs), CAPS.embedding_size), len(request.inputs), np.float32)
        result = Result.success(request_id, MODEL, rows, "float32", "little", len(request.inputs))
        answering.publish(connection, result, RESULT_TTL, request.reply_to, only_if_absent=False)
