"""Wire formats round-trip: requests, result blobs (every dtype and byte order), malformed bytes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from embedfleet.common.dtypes import (FP8_DTYPES, bfloat16_bits_to_float32, float32_to_bfloat16_bits,
                                      fp8_bits_to_float32, storage_dtype)
from embedfleet.common.errors import DecodeError, InputTooLongError, ValidationError
from embedfleet.common.params import EMBED_DTYPES, PoolingParams
from embedfleet.common.request import EmbedRequest, normalize_inputs
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer

texts = st.lists(st.text(min_size=1, max_size=50), min_size=1, max_size=5)
token_lists = st.lists(st.lists(st.integers(0, 30000), min_size=1, max_size=8), min_size=1, max_size=4)
params = st.builds(
    PoolingParams,
    dimensions=st.none() | st.integers(1, 4096),
    use_activation=st.none() | st.booleans(),
    truncate_prompt_tokens=st.none() | st.just(-1) | st.integers(1, 512),
    truncation_side=st.none() | st.sampled_from(["left", "right"]),
    prompt_name=st.none() | st.sampled_from(["query", "document"]),
    add_special_tokens=st.booleans(),
    embed_dtype=st.sampled_from(EMBED_DTYPES),
    endianness=st.sampled_from(["native", "little", "big"]),
)


@given(inputs=texts | token_lists, params=params, reply_to=st.none() | st.text(max_size=20))
def test_request_round_trips(inputs, params, reply_to):
    request = EmbedRequest(model="m", inputs=inputs, params=params, reply_to=reply_to)
    assert EmbedRequest.decode(request.encode()) == request


@pytest.mark.parametrize("raw", [b"\xc1garbage", msgpack.packb([1, 2]), msgpack.packb({"v": 1}),
                                 msgpack.packb({"v": 99, "model": "m", "inputs": ["a"]}),
                                 msgpack.packb({"v": 1, "model": "m", "inputs": []})])
def test_malformed_request_is_one_decode_error_keeping_the_bytes(raw):
    with pytest.raises(DecodeError) as info:
        EmbedRequest.decode(raw)
    assert info.value.raw == raw
    assert info.value.code == "decode_error"
    assert "malformed embed request" in info.value.message


def _stored(embed_dtype: str, values: np.ndarray) -> np.ndarray:
    """A plausible stored array for each dtype, from float values."""
    if embed_dtype in ("float32", "float16"):
        return values.astype(embed_dtype)
    if embed_dtype == "bfloat16":
        return float32_to_bfloat16_bits(values)
    if embed_dtype in ("int8", "binary"):
        return np.clip(values, -128, 127).astype(np.int8)
    return np.clip(values, 0, 255).astype(np.uint8)


@settings(max_examples=200)
@given(embed_dtype=st.sampled_from(EMBED_DTYPES), endianness=st.sampled_from(["native", "little", "big"]),
       values=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6),
                         elements=st.floats(-200, 200, width=32)),
       tokens=st.integers(0, 10**6))
def test_result_blob_round_trips_every_dtype_and_byte_order(embed_dtype, endianness, values, tokens):
    stored = _stored(embed_dtype, values)
    result = Result.success("rid", "m", stored, embed_dtype, endianness, tokens)
    decoded = Result.decode(result.encode())
    assert decoded == result
    assert decoded.endianness in ("little", "big")
    np.testing.assert_array_equal(decoded.stored, stored)
    assert decoded.stored.dtype.isnative
    expected = bfloat16_bits_to_float32(stored) if embed_dtype == "bfloat16" else \
        fp8_bits_to_float32(stored, embed_dtype) if embed_dtype in FP8_DTYPES else stored
    np.testing.assert_array_equal(decoded.embeddings, expected)
    # The blob's array bytes are what numpy.frombuffer reads with the header's dtype and byte order.
    raw = np.frombuffer(decoded.data, dtype=storage_dtype(embed_dtype, decoded.endianness))
    np.testing.assert_array_equal(raw.reshape(decoded.shape), stored)
    assert decoded.usage.prompt_tokens == tokens


def test_big_endian_bytes_really_are_big_endian():
    result = Result.success("rid", "m", np.array([[1.0]], np.float32), "float32", "big", 1)
    assert result.data == np.array([1.0], ">f4").tobytes() == b"\x3f\x80\x00\x00"


@pytest.mark.parametrize("embed_dtype,torch_dtype", [("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_fp8_bits_widen_to_torchs_values(embed_dtype, torch_dtype):
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    reference = bits.view(getattr(torch, torch_dtype)).float().numpy()
    np.testing.assert_array_equal(fp8_bits_to_float32(bits.numpy(), embed_dtype), reference)  # NaN == NaN here


@given(st.floats(width=32, allow_nan=False))
def test_bfloat16_rounding_is_nearest_even(value):
    expected = torch.tensor([value], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy()
    assert float32_to_bfloat16_bits(np.array([value], np.float32)).view(np.int16)[0] == expected[0]


def test_error_result_round_trips_and_raises_its_error():
    result = Result.failure("rid", "m", InputTooLongError("input 0 has 300 tokens, the limit is 256",
                                                          param="input"))
    decoded = Result.decode(result.encode())
    assert not decoded.ok and decoded.error_code == "input_too_long"
    with pytest.raises(InputTooLongError, match="the limit is 256"):
        _ = decoded.embeddings
    assert isinstance(decoded.error, ValidationError)


@pytest.mark.parametrize("raw", [b"", b"EFR", b"XXX\x01\x00\x00\x00\x00",
                                 Result.success("r", "m", np.ones((2, 2), np.float32), "float32", "little",
                                                1).encode()[:-3]])
def test_malformed_result_blob_is_a_decode_error(raw):
    with pytest.raises(DecodeError) as info:
        Result.decode(raw)
    assert info.value.raw == raw


def test_legacy_normalize_maps_to_use_activation():
    assert PoolingParams(normalize=False).use_activation is False
    with pytest.raises(ValueError, match="use_activation"):
        PoolingParams(normalize=False, use_activation=True)


@pytest.mark.parametrize("given_, expected", [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]),
                                              ([[1], [2, 3]], [[1], [2, 3]])])
def test_openai_input_shapes_normalise(given_, expected):
    assert normalize_inputs(given_) == expected


def test_rq_serializer_is_msgpack():
    payload = ["worker.jobs.embed", None, [b"\x00bytes"], {}]
    assert MsgpackSerializer.loads(MsgpackSerializer.dumps(payload)) == payload
    assert msgpack.unpackb(MsgpackSerializer.dumps(payload)) == payload
