"""Every integer a request carries is bounded where it enters (common/bounds.py): out of bounds is one
ValidationError naming the parameter, the value and what is allowed, never msgpack's OverflowError at enqueue."""

from __future__ import annotations

import time
import typing

import pytest
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.bounds import MAX_REQUEST_BYTES
from embedfleet.common.errors import ValidationError, invalid_request
from embedfleet.common.params import PoolingParams
from embedfleet.common.request import EmbedRequest, PartOf, normalize_inputs
from embedfleet.common.scheduling import priority_level, resolve_deadline
from embedfleet.producer.client.tasks import check_rerank
from embedfleet.producer.gateway.core.schemas import EmbedBody
from embedfleet.producer.gateway.jobs.schemas import JobBody
from embedfleet.producer.gateway.vllm.schemas import PoolingBody
from embedfleet.producer.gateway.tasks.schemas import (ClassifyBody, DetokenizeBody, RerankBody, ScoreBody,
                                                       TeiDecodeBody, TeiRerankBody, TeiTokenizeBody, TokenizeBody)

HUGE = 2**64  # one past what msgpack packs
# (model, field, a value out of bounds, what the message must say): every integer field of a request model.
CASES = [
    (PoolingParams, "dimensions", HUGE, "`dimensions` must be a positive integer of at most 65536, got "
                                        "18446744073709551616"),
    (PoolingParams, "truncate_prompt_tokens", -HUGE, "-1 (the model's max length) or a positive integer of at "
                                                     "most 1048576, got -18446744073709551616"),
    (PoolingParams, "chunk_size", 10**4000, "at most 1048576, got an integer of 13288 bits"),
    (PoolingParams, "chunk_spans", [[0, 5], [3, HUGE]], "`chunk_spans`[1] = [3, 18446744073709551616] must be "
                                                        "character offsets with 0 <= start < end <= 2147483647"),
    (PoolingParams, "sparse_top_k", HUGE, "`sparse_top_k` must be a positive integer of at most 65536, got "
                                          "18446744073709551616"),
    (EmbedRequest, "inputs", [[5], [1, HUGE]], "token id 18446744073709551616 (input 1, position 1) is out of "
                                               "range: allowed is 0 to 2147483647"),
    (EmbedRequest, "deadline", 1e15, "at most 253402300799 (the year 9999), got 1000000000000000.0"),
    (PartOf, "index", HUGE, "less than or equal to 2147483647"),
    (PartOf, "parts", HUGE, "less than or equal to 2147483647"),
    (EmbedBody, "dimensions", HUGE, "at most 65536, got 18446744073709551616"),
    (EmbedBody, "truncate_prompt_tokens", HUGE, "at most 1048576, got 18446744073709551616"),
    (EmbedBody, "chunk_size", 0, "a positive number of tokens, at most 1048576, got 0"),
    (EmbedBody, "chunk_spans", [[-1, 2]], "[-1, 2] must be character offsets"),
    (EmbedBody, "sparse_top_k", 0, "`sparse_top_k` must be a positive integer of at most 65536, got 0"),
    (EmbedBody, "priority", HUGE, "`priority` must be an integer from -2147483648 to 2147483647"),
    (EmbedBody, "deadline", time.time() * 1000, "at most 253402300799 (the year 9999)"),  # milliseconds
    (EmbedBody, "timeout", 1e300, "`timeout` must be a positive number of seconds from submit, at most "
                                  "315360000 (10 years), got 1e+300"),
    (ScoreBody, "truncate_prompt_tokens", HUGE, "at most 1048576"),
    (RerankBody, "truncate_prompt_tokens", HUGE, "at most 1048576"),
    (RerankBody, "top_n", HUGE, "`top_n` must be 0 (all) or a positive integer of at most 2147483647, got "
                                "18446744073709551616"),
    (ClassifyBody, "truncate_prompt_tokens", HUGE, "at most 1048576"),
    (DetokenizeBody, "tokens", [1, HUGE], "tokens.1: a token id must be 0 to 2147483647, got 18446744073709551616"),
    (TeiDecodeBody, "ids", [[1], [2, -1]], "`ids`: token id -1 (input 1, position 1) is out of range"),
]
REQUIRED = {EmbedRequest: {"model": "m", "inputs": ["x"]}, PartOf: {"parent": "p", "index": 0, "parts": 1},
            EmbedBody: {"input": "x"}, ScoreBody: {"text_1": "a", "text_2": "b"},
            RerankBody: {"query": "q", "documents": ["d"]}, ClassifyBody: {"input": "x"},
            DetokenizeBody: {"tokens": [1]}, TeiDecodeBody: {"ids": [1]}}
SUBCLASSES = {PoolingBody: EmbedBody, JobBody: EmbedBody}  # the same fields, checked through their parent
MODELS = [PoolingParams, EmbedRequest, PartOf, EmbedBody, PoolingBody, JobBody, ScoreBody, RerankBody, TeiRerankBody,
          ClassifyBody, TokenizeBody, TeiTokenizeBody, DetokenizeBody, TeiDecodeBody]


def integer_fields(model: type[BaseModel]) -> set[str]:
    """The fields whose type holds an int anywhere (in a union, a list, a tuple), booleans aside."""
    def holds_int(tp) -> bool:
        return tp is int or any(holds_int(arg) for arg in typing.get_args(tp))
    return {name for name, info in model.model_fields.items() if holds_int(info.annotation)}


def test_every_integer_field_of_every_request_model_has_a_case():
    listed = {(model, field) for model, field, *_ in CASES}
    for model in MODELS:
        checked_as = SUBCLASSES.get(model, model)
        missing = {field for field in integer_fields(model) if (checked_as, field) not in listed}
        assert not missing, f"{model.__name__}: integer fields without a bound and a test: {missing}"


@pytest.mark.parametrize("model, field, value, says", CASES, ids=[f"{m.__name__}.{f}" for m, f, *_ in CASES])
def test_an_integer_out_of_bounds_is_refused_naming_it(model, field, value, says):
    with pytest.raises(PydanticValidationError) as caught:
        model(**{**REQUIRED.get(model, {}), field: value})
    error = invalid_request(caught.value.errors())
    assert says in error.message and error.param == field and error.code == "invalid_request"


def test_the_bounds_themselves_are_allowed():
    PoolingParams(dimensions=65536, truncate_prompt_tokens=1 << 20, chunk_size=1 << 20,
                  chunk_spans=[[0, 2**31 - 1]])
    PoolingParams(truncate_prompt_tokens=-1)
    assert normalize_inputs([0, 2**31 - 1]) == [[0, 2**31 - 1]]
    assert EmbedRequest(model="m", inputs=[[2**31 - 1]]).encode()
    assert priority_level(2**31 - 1) == "bulk" and priority_level(-(2**31)) == "interactive"
    assert resolve_deadline(253402300799, 315360000, time.time()) is not None


def test_token_ids_and_scheduling_from_python_keywords():
    for inputs in ([HUGE], [[1], [HUGE]], [-1]):
        with pytest.raises(ValidationError, match=r"`input`: token id .* is out of range: allowed is 0 to "
                                                  r"2147483647") as caught:
            normalize_inputs(inputs)
        assert caught.value.param == "input"
    with pytest.raises(ValidationError, match="the year 9999") as caught:
        resolve_deadline(10**400, None, time.time())  # too large for a float: refused, not an OverflowError
    assert caught.value.param == "deadline"
    with pytest.raises(ValidationError, match="an integer of 1329 bits") as caught:
        resolve_deadline(None, 10**400, time.time())
    assert caught.value.param == "timeout"
    with pytest.raises(ValidationError, match=r"`priority` .* got 18446744073709551616"):
        priority_level(HUGE)
    with pytest.raises(ValidationError, match=r"`top_n` .* got -1") as caught:
        check_rerank("q", ["d"], -1)
    assert caught.value.param == "top_n"


def test_a_request_larger_than_a_request_may_be_fails_at_encode_alone():
    text = "x" * (MAX_REQUEST_BYTES // 4)
    assert EmbedRequest(model="m", inputs=[text] * 3).encode()  # 12 MiB: allowed
    with pytest.raises(ValidationError, match=rf"a request may be at most {MAX_REQUEST_BYTES} bytes: split") as caught:
        EmbedRequest(model="m", inputs=[text] * 5).encode()
    assert caught.value.param == "input" and caught.value.code == "invalid_request"


def test_a_value_past_every_bound_still_fails_as_a_validation_error():
    """A request built without validation (model_construct) cannot be packed: a ValidationError of its own."""
    params = PoolingParams.model_construct(chunk_spans=((0, HUGE),))
    request = EmbedRequest.model_construct(model="m", inputs=["x"], params=params)
    with pytest.raises(ValidationError, match="cannot be encoded: OverflowError"):
        request.encode()
