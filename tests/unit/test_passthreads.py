"""A small CPU forward pass runs on one torch thread, every other pass on the threads set at start-up (no Redis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.request import EmbedRequest
from worker.engine import passthreads
from worker.engine.engine import Engine
from worker.engine.models.nullmodel import NullModel


class _Counting(NullModel):
    """The null model on `device`, noting torch's thread count inside each pass (rows, threads)."""

    def __init__(self, device: str):
        super().__init__("null:8", "m")
        self.device, self.seen = device, []

    def prepare(self, request):
        from worker.engine.preprocess import Prepared

        return Prepared([[ord(c) for c in text] for text in request.inputs])  # a token per character

    def embed(self, token_lists, prompt_lengths=None):
        self.seen.append((len(token_lists), torch.get_num_threads()))
        return np.ones((len(token_lists), 8), np.float32)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("device, small_threads", [("cpu", 1), ("cuda:0", 2), ("none", 2)])
def test_small_passes_run_on_one_cpu_thread_and_the_count_comes_back(two_threads, device, small_threads):
    model = _Counting(device)
    engine = Engine(model, max_batch_tokens=1 << 20, max_batch_size=4096)
    small = [EmbedRequest(model="m", inputs=["one short text"])]  # 14 tokens
    large = [EmbedRequest(model="m", inputs=[f"text {i}" for i in range(passthreads.SMALL_PASS_TOKENS + 1)])]
    for requests in (small, large, small):
        assert all(result.ok for result in engine.run(requests))
        assert torch.get_num_threads() == 2  # restored after every pass
    assert model.seen == [(1, small_threads), (passthreads.SMALL_PASS_TOKENS + 1, 2), (1, small_threads)]


def test_a_failing_small_pass_gives_the_threads_back(two_threads):
    with pytest.raises(RuntimeError), passthreads.for_pass(1, "cpu"):
        assert torch.get_num_threads() == 1
        raise RuntimeError("the model failed")
    assert torch.get_num_threads() == 2
