"""Long inputs in chunks (--max-embed-len): against a reference chunked and combined by hand with
sentence-transformers, in one worker and spread over two, and every way a part can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedfleet.common.errors import DecodeError, InputTooLongError, InternalError
from embedfleet.common.protocol import keys
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet import Producer
from tests.harness import burst, idle_worker, one_round, serve
from tests.longinputs import MAX_LEN, cosine, hand_reference, words
from tests.tinymodels import st_reference
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model


@pytest.mark.parametrize("multiple", [1, 2.5, 7])
def test_chunked_input_equals_the_hand_reference(long_model, multiple):
    folder, model = long_model
    text = words(int(multiple * MAX_LEN), seed=int(multiple * 10))
    result = Engine(model).run([EmbedRequest(model="long", inputs=[text, "a short one"])])[0]
    expected, tokens = hand_reference(folder, text)
    assert cosine(result.embeddings[0], expected) >= 0.99999
    short, short_tokens = hand_reference(folder, "a short one")
    assert cosine(result.embeddings[1], short) >= 0.99999  # the short neighbour is untouched
    assert result.usage.prompt_tokens == tokens + short_tokens  # every chunk's tokens, specials included
    assert np.isclose(np.linalg.norm(result.embeddings[0]), 1.0, atol=1e-5)


def test_truncation_wins_over_chunking_and_limits_are_clear(long_model):
    folder, model = long_model
    engine = Engine(model)
    text = words(3 * MAX_LEN)
    truncated = engine.run([EmbedRequest(model="long", inputs=[text], params={"truncate_prompt_tokens": -1})])[0]
    first = engine.run([EmbedRequest(model="long", inputs=[" ".join(text.split()[:MAX_LEN - 2])])])[0]
    assert truncated.usage.prompt_tokens == MAX_LEN
    np.testing.assert_allclose(truncated.embeddings, first.embeddings, atol=1e-6)
    too_long = engine.run([EmbedRequest(model="long", inputs=[words(8 * MAX_LEN + 1)])])[0]
    assert too_long.error_code == "input_too_long" and "max_embed_len 256 of model" in too_long.error_message
    # Token-id inputs are cut as given (no special tokens added) and checked at submit by the producer too.
    ids = model.tokenizer(text)["input_ids"]
    by_ids = engine.run([EmbedRequest(model="long", inputs=[ids])])[0]
    assert by_ids.ok and by_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(InputTooLongError, match="max_embed_len 256 of model"):
        EmbedRequest(model="long", inputs=[[5] * (8 * MAX_LEN + 1)]).resolve(model.caps)


def test_max_embed_len_is_bounded(long_model):
    folder, _ = long_model
    from embedfleet.common.errors import StartupError

    with pytest.raises(StartupError, match="must exceed the model's max length"):
        load_model(folder, max_embed_len=MAX_LEN)
    with pytest.raises(StartupError, match="at most 1048576"):
        load_model(folder, max_embed_len=1 << 21)


def test_chunks_spread_over_two_workers_equal_the_reference(long_model, redis_url, redis_client):
    folder, model = long_model
    first, second = (idle_worker(Engine(model), redis_client, max_jobs=1, name=name, chunks_per_job=2)
                     for name in ("first", "second"))
    text = words(7 * MAX_LEN, seed=3)  # 222 content tokens: 8 chunks, + 1 short input: 5 parts of 2 rows
    with Producer(redis_url) as producer:
        request_id = producer.submit([text, "a short one"], "long", endianness="big")
        assert one_round(first) == [request_id]  # tokenised, spread: the parts are queued
        assert producer.get(request_id) is None and producer.status(request_id) == "started"
        assert redis_client.llen(first.queue.key) == 5
        part = one_round(first)  # one part here, the rest on the second worker
        assert burst(second)
        result = producer.wait(request_id, timeout=30)
    expected, tokens = hand_reference(folder, text)
    short, short_tokens = hand_reference(folder, "a short one")
    assert result.endianness == "big" and result.shape == (2, 32)  # the request's own output options
    assert cosine(result.embeddings[0], expected) >= 0.99999
    assert cosine(result.embeddings[1], short) >= 0.99999
    assert result.usage.prompt_tokens == tokens + short_tokens
    served_by = {redis_client.hget(f"rq:job:{keys.part_id(request_id, k)}", "worker_name") for k in range(5)}
    assert served_by == {b"first", b"second"} and len(part) == 1
    assert not redis_client.exists(keys.chunks_key(request_id))  # the join state goes with the answer
    assert not redis_client.exists(keys.result_key(keys.part_id(request_id, 0)))  # parts answer no one
    assert producer_status(redis_url, request_id) == "finished"


def producer_status(redis_url: str, request_id: str) -> str:
    with Producer(redis_url) as producer:
        return producer.status(request_id)


class _FailingOnce:
    """The real model, whose forward pass fails for any batch holding a row of `poison` length."""

    prepare = None  # tokenised by the engine

    def __init__(self, model, poison: int):
        self.model, self.poison = model, poison
        self.caps, self.tokenizer, self.pooler = model.caps, model.tokenizer, model.pooler
        self.module, self.device, self.folder = model.module, model.device, model.folder  # key the vector cache

    def embed(self, token_lists, prompt_lengths=None):
        if any(len(ids) == self.poison for ids in token_lists):
            raise RuntimeError("device fault")
        return self.model.embed(token_lists, prompt_lengths)

    def prompt_length(self, prompt, add_special_tokens):
        return self.model.prompt_length(prompt, add_special_tokens)


def test_a_failed_part_fails_the_request_once_and_nothing_hangs(long_model, redis_url, redis_client):
    _, model = long_model
    spreader = idle_worker(Engine(model), redis_client, max_jobs=1, name="spreader", chunks_per_job=2)
    text = words(3 * (MAX_LEN - 2) + 9, seed=5)  # chunks of 32, 32, 32, 9 tokens: 2 parts, the 9 in the last
    with Producer(redis_url) as producer:
        request_id = producer.submit([text], "long")
        one_round(spreader)
        burst(Engine(_FailingOnce(model, poison=9)), redis_client, max_jobs=4, name="failing")
        with pytest.raises(InternalError, match=r"chunk part 2 of 2 failed: forward pass failed"):
            producer.wait(request_id, timeout=10)
    # The part is failed in rq (not retried alone) and left no answer of its own.
    failed = redis_client.hget(f"rq:job:{keys.part_id(request_id, 1)}", "status")
    assert failed == b"failed" and not redis_client.exists(keys.result_key(keys.part_id(request_id, 1)))
    assert Result.decode(redis_client.get(keys.result_key(request_id))).error_code == "internal_error"


# -- late chunking --------------------------------------------------------------------------------------

def full_context_reference(folder: str, ids: list[int], spans) -> np.ndarray:
    """One forward pass of sentence-transformers' Transformer module over the whole input, the mean of each
    span's token states, then the folder's Dense module (if any), normalised."""
    model = st_reference(folder, drop_normalize=True)
    features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        states = model[0](features)["token_embeddings"][0]
        pooled = torch.stack([states[start:end].mean(0) for _, start, end, _, _ in spans])
        for module in list(model)[2:]:
            pooled = module({"sentence_embedding": pooled})["sentence_embedding"]
    vectors = pooled.double().numpy()
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("flavour", ["long", "dense"])
def test_late_chunking_spans_equal_one_full_context_pass(long_model, bert_dense_normalize, flavour):
    folder, model = long_model if flavour == "long" else (bert_dense_normalize, load_model(bert_dense_normalize))
    text = words(MAX_LEN, seed=7)  # 30 words: spans of 8 content tokens -> 8, 8, 8, 6
    ids = model.tokenizer(text)["input_ids"]
    result = Engine(model).run([EmbedRequest(model="m", inputs=[text], params={"chunk_size": 8})])[0]
    assert result.ok, result.error_message
    assert [span[1:3] for span in result.spans] == [(1, 9), (9, 17), (17, 25), (25, 31)]  # [CLS] left out
    for _, start, end, char_start, char_end in result.spans:  # each span's characters are its words
        assert text[char_start:char_end] == " ".join(text.split()[start - 1:end - 1])
    expected = full_context_reference(folder, ids, result.spans)
    assert min(cosine(a, b) for a, b in zip(result.embeddings, expected)) >= 0.99999
    assert result.usage.prompt_tokens == len(ids)  # one pass over the input, whatever the spans
    # Character spans: the tokens that overlap each, pooled the same way.
    second = text.index(text.split()[10])
    by_chars = Engine(model).run([EmbedRequest(model="m", inputs=[text],
                                               params={"chunk_spans": [[0, second], [second, len(text)]]})])[0]
    assert [span[1:3] for span in by_chars.spans] == [(1, 11), (11, 31)]
    expected = full_context_reference(folder, ids, by_chars.spans)
    assert min(cosine(a, b) for a, b in zip(by_chars.embeddings, expected)) >= 0.99999


def test_late_chunking_bad_requests_say_what_is_allowed(long_model):
    _, model = long_model
    engine, text = Engine(model), words(20)

    def error(inputs, **params):
        try:
            return EmbedRequest(model="long", inputs=inputs, params=params).resolve(model.caps) and \
                engine.run([EmbedRequest(model="long", inputs=inputs, params=params)])[0].error_message
        except Exception as exc:  # noqa: BLE001 - the message is what this test reads
            return str(exc)

    assert "allowed is 1 to 31" in error([text], chunk_size=MAX_LEN)
    assert "not both" in error([text], chunk_size=4, chunk_spans=[[0, 3]])
    assert "exactly one text" in error([text, text], chunk_spans=[[0, 3]])
    spans_for_two = EmbedRequest(model="long", inputs=[text, text], params={"chunk_spans": [[0, 3]]})
    assert "exactly one text" in engine.run([spans_for_two])[0].error_message  # the worker checks too
    assert "0 <= start < end" in error([text], chunk_spans=[[5, 5]])
    assert "reaches past the input's" in error([text], chunk_spans=[[0, len(text) + 1]])
    assert "the maximum 32 of model" in error([words(MAX_LEN + 5)], chunk_size=8)  # read whole: never chunked


def test_a_poisoned_part_fails_the_request_and_a_corrupt_plan_fails_only_its_request(long_model, redis_url,
                                                                                    redis_client):
    _, model = long_model
    spreader = idle_worker(Engine(model), redis_client, max_jobs=8, name="spreader", chunks_per_job=2)
    with Producer(redis_url) as producer:
        poisoned = producer.submit([words(3 * MAX_LEN, seed=1)], "long")
        corrupt = producer.submit([words(3 * MAX_LEN, seed=2)], "long")
        junk = producer.submit([words(3 * MAX_LEN, seed=3)], "long")
        assert sorted(one_round(spreader)) == sorted([poisoned, corrupt, junk])  # all spread, 2 parts each
        redis_client.hset(f"rq:job:{keys.part_id(junk, 1)}", "data", b"junk")  # a part whose data is unreadable
        # The workers of part 1 of one "died" with it three times: taken again, it is poison, never run.
        redis_client.hset(f"rq:job:{keys.part_id(poisoned, 0)}", "lapses", 3)
        redis_client.hset(keys.chunks_key(corrupt), "plan", b"\xc1 not msgpack")  # Redis holds anything
        plain = producer.submit(["a short one"], "long")
        burst(Engine(model), redis_client, max_jobs=16, name="server")
        with pytest.raises(Exception) as info:
            producer.wait(poisoned, timeout=10)
        assert info.value.code == "poison" and "chunk part 1 of 2 failed" in info.value.message
        with pytest.raises(InternalError, match="combining the chunk parts failed"):
            producer.wait(corrupt, timeout=10)
        with pytest.raises(DecodeError, match="chunk part 2 failed: job data is not msgpack"):
            producer.wait(junk, timeout=10)
        assert producer.wait(plain, timeout=10).ok  # the same rounds served it
    assert not redis_client.exists(keys.chunks_key(poisoned), keys.chunks_key(corrupt), keys.chunks_key(junk))


def test_decoder_chunks_each_end_with_its_eos_and_pool_their_last_token(decoder_lasttoken):
    """A decoder embedder (last-token pooling, `<eos>` appended, left padding): every chunk gets its own
    `<eos>`, so each chunk vector is what the model gives that chunk alone."""
    model = load_model(decoder_lasttoken, max_embed_len=4096)
    reference = st_reference(decoder_lasttoken, drop_normalize=True)
    tokenizer = reference.tokenizer
    text = " ".join(words(300, seed=4).split())
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    room, max_len = model.caps.max_model_len - 1, model.caps.max_model_len
    assert len(content) + 1 > max_len
    chunks = [[*content[i:i + room], tokenizer.eos_token_id] for i in range(0, len(content), room)]
    vectors = []
    for ids in chunks:
        features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            vectors.append(reference(features)["sentence_embedding"][0].double().numpy())
    weights = np.array([len(ids) for ids in chunks], np.float64)
    expected = (np.stack(vectors) * weights[:, None]).sum(0) / weights.sum()
    result = Engine(model).run([EmbedRequest(model="m", inputs=[text, "rain"])])[0]
    assert result.ok and cosine(result.embeddings[0], expected) >= 0.99999
    assert result.usage.prompt_tokens == weights.sum() + len(tokenizer("rain")["input_ids"])


def test_late_chunking_of_many_inputs_runs_in_budgeted_passes(long_model):
    _, model = long_model
    texts = [words(MAX_LEN - 4, seed=s) for s in range(6)]
    small = Engine(model, max_batch_tokens=2 * MAX_LEN)  # two inputs per pass
    result = small.run([EmbedRequest(model="m", inputs=texts, params={"chunk_size": 10})])[0]
    assert small.forward_passes == 3 and [span[0] for span in result.spans] == [i for i in range(6) for _ in range(3)]
    alone = [Engine(model).run([EmbedRequest(model="m", inputs=[t], params={"chunk_size": 10})])[0] for t in texts]
    np.testing.assert_allclose(result.embeddings, np.vstack([r.embeddings for r in alone]), atol=1e-5)


def test_worker_refuses_a_max_embed_len_at_or_below_the_max_length_in_one_line(long_model, redis_url, tmp_path):
    from tests.commands import assert_one_line_error, clean_env, embedfleet

    folder, _ = long_model
    done = embedfleet("worker", "--model", folder, "--redis-url", redis_url, "--max-embed-len", str(MAX_LEN),
                      env=clean_env(tmp_path))
    assert_one_line_error(done, 1, f"--max-embed-len {MAX_LEN} must exceed the model's max length ({MAX_LEN}")


def test_two_serving_workers_join_concurrent_parts_once(long_model, redis_url, redis_client):
    """Two workers serving at once (their own loops, threads), parts of one chunk each: every request is
    answered once, equal to the same request chunked in one worker, and no join state is left."""
    _, model = long_model
    texts = [words(int(m * MAX_LEN), seed=20 + k) for k, m in enumerate((7, 2.5, 5))]
    local = Engine(model).run([EmbedRequest(model="long", inputs=[t]) for t in texts])
    options = {"max_jobs": 4, "chunks_per_job": 1}
    with serve(Engine(model), redis_client, name="w0", **options) as first, \
            serve(Engine(model), redis_client, name="w1", **options) as second, Producer(redis_url) as producer:
        ids = [producer.submit([t], "long") for t in texts]
        results = [producer.wait(i, timeout=60) for i in ids]
    for result, alone in zip(results, local):
        assert cosine(result.embeddings[0], alone.embeddings[0]) >= 0.99999
        assert result.usage.prompt_tokens == alone.usage.prompt_tokens
    assert sum(w.chunk_jobs.joined_parts for w in (first, second)) == sum(len(alone_parts(t, model)) for t in texts)
    assert not any(redis_client.exists(keys.chunks_key(i)) for i in ids)


def alone_parts(text: str, model) -> list:
    """The chunks one worker makes of `text` (one part each at chunks_per_job=1)."""
    from embedfleet.worker.engine.preprocess import prepare

    return prepare(model, EmbedRequest(model="long", inputs=[text]).resolve(model.caps)).token_lists
