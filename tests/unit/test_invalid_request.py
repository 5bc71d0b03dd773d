"""common.errors.invalid_request: pydantic's errors as one message, in linear time and of bounded length (issue 49),
never suggesting the very field it refuses (issue 50)."""

from __future__ import annotations

import time

import pytest

from embedfleet.common.errors import MAX_MESSAGE, MAX_PROBLEMS, REQUEST_FIELDS, ValidationError, invalid_request
from embedfleet.producer.client.core import build_request


def extra(*fields: str) -> list[dict]:
    return [{"type": "extra_forbidden", "loc": ("body", field), "msg": "Extra inputs are not permitted"}
            for field in fields]


def test_one_unknown_keyword_of_the_python_client_reads_as_before():
    with pytest.raises(ValidationError) as caught:
        build_request("hi", "m", None, {"dimension": 8})
    assert caught.value.message == "`dimension` is not a request field; did you mean `dimensions`?"
    assert caught.value.param == "dimension"
    with pytest.raises(ValidationError) as caught:
        build_request("hi", "m", None, {"bad_field": 1})
    assert caught.value.message == f"`bad_field` is not a request field; known fields are {', '.join(REQUEST_FIELDS)}"


def test_the_field_refused_is_never_its_own_suggestion():
    """`priority` is a request field of some bodies: one that does not take it does not suggest it back."""
    message = invalid_request(extra("priority")).message
    assert "did you mean `priority`" not in message and message.startswith("`priority` is not a request field")
    assert "priority" not in message.partition("known fields are")[2]


def test_many_problems_are_listed_up_to_the_cap_and_counted_past_it():
    fields = [f"k{i}" for i in range(200_000)]
    began = time.monotonic()
    message = invalid_request(extra("dimension", *fields)).message
    assert time.monotonic() - began < 30  # 200,000: past 10 minutes before (a list scan, a difflib per field)
    assert message.startswith("`dimension` is not a request field; did you mean `dimensions`?; `k0` is not")
    assert f"; and {200_001 - MAX_PROBLEMS} more problems; known fields are input," in message
    assert f"`k{MAX_PROBLEMS - 1}`" not in message and len(message) < MAX_MESSAGE


def test_only_the_first_unknown_fields_are_matched():
    message = invalid_request(extra("dimension", "dimensionz", "dimensiom", "dimensionn")).message
    assert message.count("did you mean `dimensions`") == 3 and "`dimensionn` is not a request field;" in message
    assert message.endswith(f"known fields are {', '.join(REQUEST_FIELDS)}")  # for the one not matched


def test_the_same_problem_is_said_once():
    errors = extra("a", "a") + [{"type": "int_type", "loc": ("dimensions",), "msg": "Input should be a valid integer"}]
    assert invalid_request(errors).message.count("`a` is not a request field") == 1
