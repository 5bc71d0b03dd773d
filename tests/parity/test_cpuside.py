"""The worker's CPU side per round: one tokenizer call per round gives what one call per request gave (every
per-request setting and error kept), padding in numpy gives the Python loop's inputs, the tokenizer's Rust
backend gives the wrapper's ids, and the stage clocks reach the worker's metrics."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from embedfleet.common.request import EmbedRequest
from tests.harness import burst
from tests.rqjobs import enqueue
from tests.tinymodels import sample_texts
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.encode import token_ids
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.base import pad_batch
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.preprocess import prepare, prepare_many
from embedfleet.worker.serving.metrics import WorkerMetrics


@pytest.fixture(scope="module")
def tiny(bert_mean):
    return Engine(load_model(bert_mean, served_name="m"), max_batch_tokens=512, max_batch_size=16)


def req(inputs, **params) -> EmbedRequest:
    return EmbedRequest(model="m", inputs=list(inputs), params=params)


def mixed_round() -> list[EmbedRequest]:
    """Requests whose tokenizer settings differ (and some that must fail alone), interleaved."""
    texts = sample_texts(40, seed=3, max_words=8)
    long = " ".join(texts)  # past the tiny model's 128 positions
    return [
        req(texts[0:4]),
        req(texts[4:6], truncate_prompt_tokens=5),
        req([long], truncate_prompt_tokens=-1, truncation_side="left"),
        req(texts[6:9], add_special_tokens=False),
        req([long]),  # too long, not truncated: fails alone
        req(texts[9:12], prompt="query: "),
        req([[5, 6, 7, 8, 9, 10]], truncate_prompt_tokens=3),  # token ids: never tokenised
        req(texts[12:14], truncate_prompt_tokens=5),  # groups with the second request
        req([" "], add_special_tokens=False),  # no tokens: fails alone
        req(texts[14:15], truncate_prompt_tokens=1),  # below the special tokens: the slicing fallback
        req([long], truncate_prompt_tokens=-1),
        req(texts[0:4]),  # a duplicate of the first
    ]


def test_a_round_tokenised_together_equals_each_request_alone(tiny):
    requests = [tiny._resolve(r) for r in mixed_round()]
    together = prepare_many(tiny.model, requests)
    for request, got in zip(requests, together, strict=True):
        try:
            alone = prepare(tiny.model, request)
        except Exception as exc:  # noqa: BLE001 - compared with what the round handed back
            assert type(got) is type(exc) and str(got) == str(exc)
            continue
        assert not isinstance(got, Exception), got
        assert got.token_lists == alone.token_lists
        assert (got.prompt_length, got.owners, got.spans) == (alone.prompt_length, alone.owners, alone.spans)


def test_the_engine_answers_a_mixed_round_as_it_answers_each_request(tiny):
    requests = mixed_round()
    together = tiny.run(requests)
    alone = [tiny.run([request])[0] for request in requests]
    codes = [None if r.ok else r.error.code for r in together]
    assert codes == [None if r.ok else r.error.code for r in alone]
    assert codes.count(None) == len(requests) - 2  # the too-long text and the empty one fail, alone
    for got, want in zip(together, alone, strict=True):
        if got.ok:
            assert got.usage == want.usage and got.shape == want.shape
            np.testing.assert_allclose(got.embeddings, want.embeddings, atol=1e-6)


def test_the_backend_gives_the_wrappers_ids(bert_mean, decoder_lasttoken):
    from transformers import AutoTokenizer

    texts = sample_texts(30, seed=5, max_words=50)
    for folder in (bert_mean, decoder_lasttoken):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for special in (True, False):
            for keep in (None, 7):
                for side in ("right", "left"):
                    tokenizer.truncation_side = side
                    want = tokenizer(texts, add_special_tokens=special, truncation=keep is not None,
                                     max_length=keep)["input_ids"]
                    assert token_ids(tokenizer, texts, special, keep) == want


def python_padding(token_lists, pad, side):
    longest = max(map(len, token_lists))
    ids = torch.full((len(token_lists), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(token_lists), longest), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        span = slice(longest - len(tokens), longest) if side == "left" else slice(0, len(tokens))
        ids[row, span] = torch.as_tensor(tokens)
        mask[row, span] = 1
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_in_numpy_equals_the_row_loop(side):
    rng = np.random.default_rng(0)
    token_lists = [list(rng.integers(1, 30000, rng.integers(1, 40))) for _ in range(50)] + [[7]]
    inputs = pad_batch(token_lists, 3, side, "cpu", position_ids=True)
    ids, mask = python_padding(token_lists, 3, side)
    assert torch.equal(inputs["input_ids"], ids) and torch.equal(inputs["attention_mask"], mask)
    assert inputs["input_ids"].dtype == torch.long and inputs["attention_mask"].dtype == torch.long
    if side == "left":
        assert torch.equal(inputs["position_ids"], (mask.cumsum(-1) - 1).clamp(min=0))


def test_stage_clocks_add_up_per_thread():
    stages = stageclock.Stages()

    def work():
        stageclock.bind(stages, "t")
        for _ in range(3):
            stageclock.lap("other")
            sum(range(10000))
            stageclock.lap("tokenise")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    stageclock.lap("unbound")  # this thread bound none: counted nowhere
    assert set(stages.snapshot()) == {"t"} and stages.snapshot()["t"]["tokenise"] > 0


def test_the_worker_reports_where_each_threads_time_goes(tiny, redis_client):
    for inputs in [sample_texts(16, seed=s) for s in range(6)]:
        enqueue(redis_client, req(inputs), queue="m")
    metrics = WorkerMetrics("m")
    burst(tiny, redis_client, max_jobs=2, metrics=metrics)
    text = metrics.render().decode()
    seconds = {}
    for line in text.splitlines():
        if line.startswith("embedfleet_worker_stage_seconds_total{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1:line.index("}")].split(","))
            seconds[labels["thread"].strip('"'), labels["stage"].strip('"')] = float(line.rsplit(" ", 1)[1])
    for stage in [("take", "take"), ("take", "decode"), ("take", "tokenise"), ("forward", "collate"),
                  ("forward", "forward"), ("forward", "pooling"), ("forward", "d2h"), ("finish", "cast"),
                  ("finish", "publish")]:
        assert seconds.get(stage, 0) > 0, (stage, sorted(seconds))
