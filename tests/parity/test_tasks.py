"""Tasks beyond embed through the fleet (real Redis, rq, BatchWorker threads, tiny random models): score
and rerank against sentence-transformers' CrossEncoder, classify against transformers + softmax, token
embeddings against the model's last hidden states, tokenize against the tokenizer, and the clear error at
submit for every task a model does not serve."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from embedfleet.common.errors import CancelledError, DecodeError, InputTooLongError, ValidationError
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet import AsyncProducer, Producer
from tests.harness import idle_worker
from tests.taskengines import DOCS, QUERY, TEXTS, engine
from tests.tinymodels import cosines, sample_texts

SUPPORTED = {"emb": ["embed", "score", "token_embed", "tokenize", "detokenize"],
             "ce": ["score", "classify", "token_classify", "tokenize", "detokenize"],
             "clf": ["classify", "token_classify", "tokenize", "detokenize"],
             "colbert": ["token_embed", "score", "tokenize", "detokenize"]}


@pytest.fixture
def folders(bert_mean, cross_encoder, classifier, colbert) -> dict[str, str]:
    return {"emb": bert_mean, "ce": cross_encoder, "clf": classifier, "colbert": colbert}


HANG = 240  # seconds after which a wait reports a hang (pytest-timeout's 300 s bounds the whole test)


@pytest.fixture
def tasks(fleet, folders) -> Producer:
    """A Producer on a fleet of one serving worker per model, in threads."""
    for name, folder in folders.items():
        fleet.serve(engine(folder, name))
    return fleet.producer


def test_tasks_are_advertised(tasks):
    served = tasks.models()
    assert {name: list(caps.tasks) for name, caps in served.items()} == SUPPORTED
    assert served["clf"].labels == ("negative", "neutral", "positive")


def test_score_equals_cross_encoder_predict(tasks, cross_encoder):
    reference = CrossEncoder(cross_encoder, device="cpu")
    pairs = [(QUERY, d) for d in DOCS]
    assert reference.activation_fn.__class__.__name__ == "Sigmoid"
    np.testing.assert_allclose(tasks.score(QUERY, DOCS, "ce"), reference.predict(pairs), rtol=1e-5, atol=1e-6)
    raw = reference.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(tasks.score(QUERY, DOCS, "ce", use_activation=False), raw, rtol=1e-4, atol=1e-5)
    # pairwise (N:N) lists, as vLLM's score takes them
    firsts = sample_texts(len(DOCS), seed=9)
    np.testing.assert_allclose(tasks.score(firsts, DOCS, "ce"), reference.predict(list(zip(firsts, DOCS))),
                               rtol=1e-5, atol=1e-6)


def test_a_pair_over_the_max_length_fails_alone_unless_truncated(tasks, cross_encoder):
    long = " ".join(sample_texts(40, seed=5))  # far past the model's 128 positions
    bad = tasks.submit([QUERY, QUERY], "ce", task="score", text_pair=[long, DOCS[0]])
    good = tasks.submit([QUERY], "ce", task="score", text_pair=[DOCS[0]])
    with pytest.raises(InputTooLongError, match="pair 0 has"):
        tasks.wait(bad)
    assert tasks.wait(good).scores.shape == (1,)  # the worker and the other requests go on
    reference = CrossEncoder(cross_encoder, device="cpu")  # truncates to its max_length (128), longest first
    np.testing.assert_allclose(tasks.score(QUERY, [long], "ce", truncate_prompt_tokens=-1),
                               reference.predict([(QUERY, long)]), rtol=1e-5)


def test_rerank_orders_like_cross_encoder_rank(tasks, cross_encoder):
    reference = CrossEncoder(cross_encoder, device="cpu").rank(QUERY, DOCS, top_k=3, return_documents=True)
    ranked = tasks.rerank(QUERY, DOCS, "ce", top_n=3, return_documents=True)
    assert [r["index"] for r in ranked] == [r["corpus_id"] for r in reference]
    assert [r["document"]["text"] for r in ranked] == [r["text"] for r in reference]
    np.testing.assert_allclose([r["relevance_score"] for r in ranked], [r["score"] for r in reference], rtol=1e-5)
    everything = tasks.rerank(QUERY, DOCS, "ce")
    assert len(everything) == len(DOCS) and "document" not in everything[0]
    assert [r["relevance_score"] for r in everything] == sorted((r["relevance_score"] for r in everything),
                                                                reverse=True)


def test_classify_equals_softmax_of_the_logits(tasks, classifier):
    model = AutoModelForSequenceClassification.from_pretrained(classifier).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    with torch.no_grad():
        logits = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in TEXTS]).numpy()
    result = tasks.classify(TEXTS, "clf")
    assert result.labels == ("negative", "neutral", "positive")
    assert result.scores.shape == (len(TEXTS), 3)
    np.testing.assert_allclose(result.scores, torch.softmax(torch.from_numpy(logits), -1).numpy(), atol=1e-6)
    np.testing.assert_allclose(tasks.classify(TEXTS, "clf", use_activation=False).scores, logits, atol=1e-5)


def _hidden_states(folder: str, texts: list[str]) -> list[np.ndarray]:
    """Each text alone (no padding at all): its last hidden states."""
    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0].numpy() for t in texts]


def test_token_embed_equals_last_hidden_states(tasks, bert_mean):
    vectors = tasks.token_embed(TEXTS, "emb", use_activation=False)
    reference = _hidden_states(bert_mean, TEXTS)
    assert [v.shape for v in vectors] == [r.shape for r in reference]  # padding never comes back
    for got, want in zip(vectors, reference):
        np.testing.assert_allclose(got, want, atol=2e-5)
    unit = tasks.token_embed(TEXTS[:2], "emb", use_activation=True)  # normalised per token
    np.testing.assert_allclose(unit[1], reference[1] / np.linalg.norm(reference[1], axis=-1, keepdims=True),
                               atol=1e-5)
    # the default follows the model's embed: this folder has no Normalize module
    np.testing.assert_allclose(tasks.token_embed(TEXTS[:1], "emb")[0], reference[0], atol=2e-5)


def test_colbert_tokens_are_projected_and_score_by_maxsim(tasks, colbert):
    from safetensors.torch import load_file

    weight = next(iter(load_file(f"{colbert}/1_Dense/model.safetensors").values())).numpy()
    reference = [h @ weight.T for h in _hidden_states(colbert, DOCS)]
    vectors = tasks.token_embed(DOCS, "colbert", use_activation=False)
    for got, want in zip(vectors, reference):
        np.testing.assert_allclose(got, want, atol=2e-5)
    query = [h @ weight.T for h in _hidden_states(colbert, [QUERY])][0]

    def unit(v):
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    maxsim = [(unit(query) @ unit(doc).T).max(axis=1).sum() for doc in reference]
    np.testing.assert_allclose(tasks.score(QUERY, DOCS, "colbert"), maxsim, rtol=1e-5)


def test_bi_encoder_score_is_the_cosine_of_two_embeddings(tasks, bert_mean):
    reference = SentenceTransformer(bert_mean, device="cpu")
    expected = cosines(reference.encode([QUERY] * len(DOCS)), reference.encode(DOCS))
    np.testing.assert_allclose(tasks.score(QUERY, DOCS, "emb"), expected, rtol=1e-5)


def test_tokenize_and_detokenize_equal_the_tokenizer(tasks, classifier):
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    items = tasks.tokenize(TEXTS, "clf")
    assert [item["ids"] for item in items] == tokenizer(TEXTS)["input_ids"]
    assert items[0]["tokens"] == tokenizer.convert_ids_to_tokens(items[0]["ids"])
    assert items[0]["special"][0] and items[0]["special"][-1] and not any(items[0]["special"][1:-1])
    start, stop = items[0]["offsets"][1]
    assert TEXTS[0][start:stop].lower() == items[0]["tokens"][1]
    plain = tasks.tokenize(TEXTS[:1], "clf", add_special_tokens=False)[0]["ids"]
    assert plain == tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    ids = [item["ids"] for item in items]
    assert tasks.detokenize(ids, "clf") == [tokenizer.decode(i) for i in ids]


@pytest.mark.parametrize("model", sorted(SUPPORTED))
def test_every_unsupported_task_fails_at_submit_naming_the_supported_ones(tasks, redis_client, model):
    for task in {"embed", "score", "classify", "token_embed", "token_classify", "tokenize",
                 "detokenize"} - set(SUPPORTED[model]):
        with pytest.raises(ValidationError) as caught:
            tasks.submit(["some text"], model, task=task, **({"text_pair": ["b"]} if task == "score" else {}))
        assert caught.value.param == "task"
        assert caught.value.message.startswith(f"Unsupported task: '{task}'. Model '{model}' supports")  # vLLM's
        assert str(SUPPORTED[model]) in caught.value.message
    assert redis_client.llen(f"rq:queue:{queue_name(model)}") == 0


def test_the_worker_verifies_the_task_again(tasks):
    """A request that skipped the producer's check (an older producer, a hand-made job) is refused by the
    worker with the same message, alone."""
    from embedfleet.common.protocol import enqueueing

    request = EmbedRequest(model="emb", inputs=["a"], params={"task": "classify"})
    enqueueing.enqueue(tasks.redis, enqueueing.enqueue_args(queue_name("emb"), [request]))
    with pytest.raises(ValidationError, match=r"Unsupported task: 'classify'. Model 'emb' supports"):
        tasks.wait(request.id)
    assert tasks.embed(["a"], "emb").shape == (1, 32)


def test_task_inputs_are_checked_at_submit(tasks):
    with pytest.raises(ValidationError, match="takes pairs of texts"):
        tasks.submit(["a"], "ce", task="score")
    with pytest.raises(ValidationError, match="2 second texts"):
        tasks.submit(["a"], "ce", task="score", text_pair=["b", "c"])
    with pytest.raises(ValidationError, match="`text_pair` is for task 'score' only"):
        tasks.submit(["a"], "clf", task="classify", text_pair=["b"])
    with pytest.raises(ValidationError, match="takes token-id lists"):
        tasks.submit(["a"], "clf", task="detokenize")
    with pytest.raises(ValidationError, match="`dimensions` applies to task 'embed' only"):
        tasks.submit(["a"], "emb", task="token_embed", dimensions=8)
    # the bits of a token vector are packed by its own width: 16 for this ColBERT projection, 32 for the hidden
    assert tasks.token_embed(["a b"], "colbert", embed_dtype="ubinary")[0].shape == (4, 2)
    assert tasks.models()["emb"].token_size == 32 and tasks.models()["colbert"].token_size == 16
    with pytest.raises(ValidationError, match="text_1"):
        tasks.score([], DOCS, "ce")


def test_tasks_share_rounds_and_the_token_budget(tasks, bert_mean):
    """embed, token_embed, score and tokenize requests in one round of one worker each get their answer."""
    embed_id = tasks.submit(TEXTS, "emb")
    tokens_id = tasks.submit(TEXTS, "emb", task="token_embed", use_activation=False)
    score_id = tasks.submit([QUERY] * 3, "emb", task="score", text_pair=DOCS[:3])
    count_id = tasks.submit(TEXTS, "emb", task="tokenize")
    reference = SentenceTransformer(bert_mean, device="cpu")
    # Waits bounded only against a hang (the rounds of four workers share a CPU that may be busy).
    np.testing.assert_allclose(tasks.wait(embed_id, HANG).embeddings, reference.encode(TEXTS), atol=2e-5)
    tokens = tasks.wait(tokens_id, HANG)
    assert tokens.task == "token_embed" and sum(tokens.parts) == tokens.shape[0]
    assert tokens.usage.prompt_tokens == tokens.shape[0] == sum(len(i["ids"]) for i in tasks.wait(count_id, HANG).items)
    assert tasks.wait(score_id, HANG).scores.shape == (3,)


def test_a_queued_score_request_is_cancelled_like_any(redis_client, redis_url, cross_encoder):
    idle_worker(engine(cross_encoder, "ce"), redis_client)  # registered, not serving: the request stays queued
    with Producer(redis_url) as producer:
        request_id = producer.submit([QUERY], "ce", task="score", text_pair=[DOCS[0]])
        assert producer.cancel(request_id)
        with pytest.raises(CancelledError):
            producer.wait(request_id, timeout=5)


def test_async_producer_twins(tasks, redis_url, cross_encoder):
    import asyncio

    async def run():
        async with AsyncProducer(redis_url) as producer:
            return (await producer.rerank(QUERY, DOCS, "ce", top_n=2), await producer.score(QUERY, DOCS, "ce"),
                    await producer.classify(TEXTS[:2], "clf"), await producer.token_embed(TEXTS[:2], "emb"),
                    await producer.tokenize(TEXTS[:1], "clf"))

    ranked, scores, classified, vectors, items = asyncio.run(run())
    assert [r["index"] for r in ranked] == list(np.argsort(-scores)[:2])
    assert classified.scores.shape == (2, 3) and [v.shape[1] for v in vectors] == [32, 32]
    assert items == tasks.tokenize(TEXTS[:1], "clf")


def test_requests_without_a_pair_encode_as_before():
    """Workers that predate tasks refuse unknown fields: a request without `text_pair` does not carry it."""
    plain = EmbedRequest(model="m", inputs=["a"])
    assert b"text_pair" not in plain.encode() and EmbedRequest.decode(plain.encode()) == plain
    paired = EmbedRequest(model="m", inputs=["a"], text_pair=["b"], params={"task": "score"})
    assert EmbedRequest.decode(paired.encode()) == paired


def test_result_blob_keeps_task_keys_and_embed_blobs_unchanged():
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    blob = Result.success("r1", "m", rows, "float32", "little", 6).with_task("token_embed", parts=[4, 2])
    back = Result.decode(blob.encode())
    assert back.parts == (4, 2) and [v.shape for v in back.multi_vectors] == [(4, 2), (2, 2)]
    embed = Result.success("r2", "m", rows, "float32", "little", 6).encode()
    assert b"task" not in embed and b"parts" not in embed  # an embed blob is what older readers know
    bad_items = Result.success("r4", "m", np.zeros((1, 0), np.float32), "float32", "little", 1)
    with pytest.raises(DecodeError, match="tokenize item"):
        Result.decode(bad_items.with_task("tokenize", items=[{"ids": [1, 2], "tokens": ["a"], "special": []}]).encode())
    with pytest.raises(DecodeError, match="3 labels"):
        Result.decode(Result.success("r5", "m", rows, "float32", "little", 6).with_task("classify",
                                                                                       labels=["a", "b", "c"]).encode())
    with pytest.raises(DecodeError, match="do not add up"):
        Result.decode(Result.success("r3", "m", rows, "float32", "little", 6).with_task(
            "token_embed", parts=[4, 4]).encode())
