"""A decoded request's params map is validated once per distinct map (common.params.from_wire): the same request,
the same error messages, lone surrogates still refused, nothing remembered that differs by type or holds lists."""

from __future__ import annotations

import msgpack
import pytest

from embedfleet.common.errors import DecodeError
from embedfleet.common.params import PoolingParams, from_wire
from embedfleet.common.request import EmbedRequest


def _wire(request: EmbedRequest) -> dict:
    return msgpack.unpackb(request.encode(), raw=False)


def test_a_map_seen_again_gives_the_same_params():
    raw = _wire(EmbedRequest(model="m", inputs=["a"], params=PoolingParams(dimensions=8, embed_dtype="float16")))
    first, again = from_wire(dict(raw["params"])), from_wire(dict(raw["params"]))
    assert first is again and first == PoolingParams(dimensions=8, embed_dtype="float16")
    decoded = EmbedRequest.decode(msgpack.packb(raw, use_bin_type=True))
    assert decoded.params is first


def test_maps_equal_in_value_but_not_in_type_are_validated_apart():
    base = _wire(EmbedRequest(model="m", inputs=["a"]))["params"]
    as_int, as_bool = dict(base, add_special_tokens=1), dict(base, add_special_tokens=True)
    assert from_wire(as_bool).add_special_tokens is True
    assert from_wire(as_int) == PoolingParams.model_validate(as_int)
    assert from_wire(dict(base, dimensions=2.5)) is None  # not an integer: left to the request's own validation


def test_lists_are_not_remembered_and_still_validated():
    base = _wire(EmbedRequest(model="m", inputs=["abc"]))
    base["params"]["chunk_spans"] = [[0, 2]]
    assert from_wire(base["params"]) is None
    assert EmbedRequest.decode(msgpack.packb(base, use_bin_type=True)).params.chunk_spans == ((0, 2),)


@pytest.mark.parametrize("bad", [{"dimensions": 0}, {"embed_dtype": "float64"}, {"nonsense": 1}])
def test_bad_params_fail_with_the_requests_own_message(bad):
    raw = _wire(EmbedRequest(model="m", inputs=["a"]))
    raw["params"].update(bad)
    with pytest.raises(DecodeError) as caught:
        EmbedRequest.decode(msgpack.packb(raw, use_bin_type=True))
    assert "validation error for EmbedRequest" in caught.value.message
    assert "params." in caught.value.message


def test_a_lone_surrogate_on_the_wire_is_still_refused():
    raw = msgpack.packb({**_wire(EmbedRequest(model="m", inputs=["hello"]))}, use_bin_type=True)
    broken = raw.replace(b"hello", b"h\xed\xa0\x80o")  # U+D800 written as UTF-8 bytes
    with pytest.raises(DecodeError, match="utf-8"):
        EmbedRequest.decode(broken)
    with pytest.raises(ValueError, match="lone surrogate"):  # built in Python: checked as before
        EmbedRequest(model="m", inputs=["h\ud800o"])


def test_with_params_is_model_copy_of_the_params():
    request = EmbedRequest.decode(EmbedRequest(model="m", inputs=["a", "b"], reply_to=None, deadline=4e9).encode())
    params = PoolingParams(dimensions=8, use_activation=True)
    lean, generic = request.with_params(params), request.model_copy(update={"params": params})
    assert lean == generic and hash(lean.params) == hash(generic.params) and lean.params is params
    assert lean.model_fields_set == generic.model_fields_set
    assert lean.__pydantic_extra__ == generic.__pydantic_extra__
    assert lean.__pydantic_private__ == generic.__pydantic_private__
    assert lean.model_dump() == generic.model_dump() and lean.encode() == generic.encode()
    assert request.params == PoolingParams()  # the original is untouched
    with pytest.raises(Exception, match="frozen"):
        lean.model = "other"


def test_resolved_params_are_model_copy_of_the_merge():
    """PoolingParams.resolve builds its merge with common/frozen.py: the same object model_copy would."""
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.nullmodel import NullModel

    caps = Engine(NullModel("null:16", served_name="null"), max_batch_tokens=64, max_batch_size=8).caps
    given = PoolingParams(dimensions=16, embed_dtype="float16")
    merged = given.resolve(caps)
    generic = given.model_copy(update={name: getattr(merged, name) for name in
                                       ("dimensions", "use_activation", "truncation_side", "prompt_name", "outputs")})
    assert merged == generic and hash(merged) == hash(generic)
    assert merged.model_fields_set == generic.model_fields_set
    assert merged.model_dump(exclude_unset=True) == generic.model_dump(exclude_unset=True)
    assert (merged.__pydantic_extra__, merged.__pydantic_private__) == (None, None) == \
        (generic.__pydantic_extra__, generic.__pydantic_private__)
    assert given == PoolingParams(dimensions=16, embed_dtype="float16")  # the original is untouched
    with pytest.raises(Exception, match="frozen"):
        merged.dimensions = 8
