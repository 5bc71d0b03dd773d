"""The names every part of the fleet shares, before any Redis: request ids, hash tags and priority levels.

A request id is also an rq job id and part of several key names (common/protocol/keys.py). On a Redis Cluster a
model's keys, queue names, request ids and worker names start with its hash tag, `{<10 hex of sha1(model)>}`
(slot_tag), so that a model's traffic is one slot; on a plain Redis nothing carries one. Stdlib only: the plain
value modules of common/ read these without the protocol (tests/unit/test_common_tiers.py).
"""

from __future__ import annotations

import hashlib
import re
import uuid

# A request id is also an rq job id and part of several key names: rq allows [A-Za-z0-9_-]+, and ours
# (uuid4 hex) are 32 characters long. Anything else read from Redis or a URL is not one of our ids.
MAX_REQUEST_ID_LENGTH = 64
MAX_TAG_LENGTH = 16  # a hash tag's characters between its braces (Redis Cluster, slot_tag)
_TAG = rf"\{{[A-Za-z0-9_-]{{1,{MAX_TAG_LENGTH}}}\}}"
ID_CHARS = rf"(?:{_TAG})?[A-Za-z0-9_-]{{1,{MAX_REQUEST_ID_LENGTH}}}"  # a request id, as a regex
_REQUEST_ID = re.compile(ID_CHARS)
_LEADING_TAG = re.compile(_TAG)


def valid_request_id(request_id: str | bytes) -> bool:
    """True if `request_id` (text, or bytes as read from Redis) can be an embedfleet request id."""
    if isinstance(request_id, bytes):
        return _REQUEST_ID.fullmatch(request_id.decode("ascii", "replace")) is not None
    return isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) is not None


PRIORITIES = ("interactive", "bulk")  # a model's priority levels, highest first (issue #10)


# -- Redis Cluster: hash tags ---------------------------------------------------------------------------

def slot_tag(model: str, partition: str = "") -> str:
    """The hash tag of `model`'s keys on a Redis Cluster: the same for every producer and worker. A model
    given several partitions on one cluster (URLs that differ in their #partition) has a tag per partition."""
    name = f"{model}#{partition}" if partition else model
    return "{" + hashlib.sha1(name.encode()).hexdigest()[:10] + "}"


def tag_of(name: str) -> str:
    """The hash tag a queue name, request id or worker name starts with, or ''."""
    found = _LEADING_TAG.match(name)
    return found.group(0) if found else ""


def untagged(name: str) -> str:
    """`name` without its leading hash tag (a queue name as a plain Redis has it)."""
    return name[len(tag_of(name)):]


def tagged_request_id(tag: str) -> str:
    """A new request id in `tag`'s slot (common.request.new_request_id's form after the tag)."""
    return tag + uuid.uuid4().hex
