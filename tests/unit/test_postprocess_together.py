"""A round's plain embed requests are cut, normalised and cast together: the same bytes as each request alone, in
request order, whatever the params mix (no Redis; the null model where a whole engine is needed)."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.params import PoolingParams
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.engine.postprocess import cast, cut_and_normalise, finish_together

DTYPES = ["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary", "fp8_e4m3"]


@pytest.mark.parametrize("embed_dtype", DTYPES)
@pytest.mark.parametrize("dimensions, normalize", [(None, True), (16, True), (None, False), (8, False)])
def test_together_equals_each_alone(embed_dtype, dimensions, normalize):
    rng = np.random.default_rng(7)
    groups = [rng.normal(size=(rows, 32)).astype(np.float32) * scale
              for rows, scale in [(1, 1.0), (3, 40.0), (2, 1e-3), (1, 0.0), (5, 7.0)]]
    together = finish_together(groups, dimensions, normalize, embed_dtype)
    assert len(together) == len(groups)
    for rows, mine in zip(groups, together, strict=True):
        alone = cast(cut_and_normalise(rows, dimensions, normalize), embed_dtype)
        assert mine.dtype == alone.dtype and mine.shape == alone.shape
        assert mine.tobytes() == alone.tobytes()  # int8/uint8 keep each request's own ranges


class _RandomRows(NullModel):
    """The null model with a distinct vector per input (its text's hash), so that a mix-up of rows shows."""

    def embed(self, token_lists, prompt_lengths=None):
        return np.stack([np.random.default_rng(ids[0]).normal(size=self.caps.embedding_size).astype(np.float32)
                         for ids in token_lists])

    def prepare(self, request):
        from embedfleet.worker.engine.seam import Prepared

        return Prepared([[sum(map(ord, text)) % 100_000] for text in request.inputs])


def test_engine_round_equals_each_request_alone():
    engine = Engine(_RandomRows("null:24", "m"), max_batch_tokens=1 << 20, max_batch_size=4096)
    mix = [PoolingParams(), PoolingParams(dimensions=8), PoolingParams(embed_dtype="float16"),
           PoolingParams(embed_dtype="int8"), PoolingParams(use_activation=False),
           PoolingParams(embed_dtype="bfloat16", endianness="big")]
    requests = [EmbedRequest(model="m", inputs=[f"text {i}", f"other {i * 7}"][:1 + i % 2], params=mix[i % len(mix)])
                for i in range(24)]
    together = engine.run(requests)
    for request, result in zip(requests, together, strict=True):
        (alone,) = engine.run([request])
        assert result.ok and result.id == request.id
        assert (result.embed_dtype, result.endianness, result.shape) == (alone.embed_dtype, alone.endianness,
                                                                          alone.shape)
        assert result.data == alone.data
        assert result.usage == alone.usage
