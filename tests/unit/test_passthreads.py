"""A small CPU forward pass runs on one torch thread while the machine is busy with other work, on all of them
otherwise, as every other pass does (worker/engine/passthreads.py; no Redis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine import passthreads
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel


class _Counting(NullModel):
    """The null model on `device`, noting torch's thread count inside each pass (rows, threads)."""

    def __init__(self, device: str):
        super().__init__("null:8", "m")
        self.device, self.seen = device, []

    def prepare(self, request):
        from embedfleet.worker.engine.seam import Prepared

        return Prepared([[ord(c) for c in text] for text in request.inputs])  # a token per character

    def embed(self, token_lists, prompt_lengths=None):
        self.seen.append((len(token_lists), torch.get_num_threads()))
        return np.ones((len(token_lists), 8), np.float32)


class _Machine:
    """A load average and a clock the test sets."""

    def __init__(self, load: float):
        self.load, self.now, self.reads = load, 0.0, 0

    def read(self) -> float:
        self.reads += 1
        return self.load


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


SMALL = [EmbedRequest(model="m", inputs=["one short text"])]  # 14 tokens
LARGE = [EmbedRequest(model="m", inputs=[f"text {i}" for i in range(passthreads.SMALL_PASS_TOKENS + 1)])]


def _engine(model, machine: _Machine) -> Engine:
    engine = Engine(model, max_batch_tokens=1 << 20, max_batch_size=4096)
    engine.small_passes = passthreads.SmallPasses(machine.read, cpus=2, clock=lambda: machine.now)
    return engine


@pytest.mark.parametrize("device, load, small_threads", [
    ("cpu", 2.5, 1), ("cpu", 0.4, 2), ("cuda:0", 2.5, 2), ("none", 2.5, 2)],
    ids=["cpu, busy machine", "cpu, quiet machine", "gpu", "null model"])
def test_small_passes_run_on_one_cpu_thread_only_on_a_busy_machine(two_threads, device, load, small_threads):
    model = _Counting(device)
    engine = _engine(model, _Machine(load))
    for requests in (SMALL, LARGE, SMALL):
        assert all(result.ok for result in engine.run(requests))
        assert torch.get_num_threads() == 2  # restored after every pass
    assert model.seen == [(1, small_threads), (passthreads.SMALL_PASS_TOKENS + 1, 2), (1, small_threads)]


def test_the_load_is_read_once_a_second_and_the_count_follows_it(two_threads):
    machine = _Machine(load=3.0)
    model = _Counting("cpu")
    engine = _engine(model, machine)
    for _ in range(5):
        engine.run(SMALL)
    machine.load = 0.2  # the other work ended; not seen until the next read
    engine.run(SMALL)
    machine.now += passthreads.LOAD_EVERY
    engine.run(SMALL)
    assert [threads for _, threads in model.seen] == [1] * 6 + [2]
    assert machine.reads == 2


def test_a_failing_small_pass_gives_the_threads_back(two_threads):
    small = passthreads.SmallPasses(lambda: 9.0, cpus=2)
    with pytest.raises(RuntimeError), small.for_pass(1, "cpu"):
        assert torch.get_num_threads() == 1
        raise RuntimeError("the model failed")
    assert torch.get_num_threads() == 2
