"""TaggedJob: rq's Job that takes a Redis Cluster's request ids (a hash tag before rq's alphabet,
common/protocol/keys.py), which rq's own refuses. For a plain id it is rq's Job unchanged."""

from __future__ import annotations

from rq.job import Job

from embedfleet.common.names import tag_of, valid_request_id


class TaggedJob(Job):
    def __init__(self, id: str | None = None, connection=None, serializer=None):
        tagged = id if id and tag_of(id) and valid_request_id(id) else None
        super().__init__(None if tagged else id, connection, serializer)
        if tagged:
            self._id = tagged
