"""Engine: verification and refusals, truncation and usage, output dtypes, batching, and the real MiniLM."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from embedfleet.common.dtypes import float32_to_bfloat16_bits
from embedfleet.common.params import EMBED_DTYPES
from embedfleet.common.quantize import quantization_ranges
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from tests.tinymodels import cosines, embed, engine_for, sample_texts, st_reference
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.fidelity import cast_with_fidelity_check
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.postprocess import cast

logging.getLogger("sentence_transformers").setLevel(logging.ERROR)


def req(inputs, **params) -> EmbedRequest:
    return EmbedRequest(model="m", inputs=list(inputs), params=params)


def roundtrip(result: Result) -> Result:
    return Result.decode(result.encode())


# --- refusals ---------------------------------------------------------------------------------------

def test_each_refusal_fails_alone_with_a_helpful_message(matryoshka_model, bert_cls):
    odd = Engine(load_model(bert_cls, served_name="odd", matryoshka_dims=[6, 16, 32]))
    assert odd.caps.is_matryoshka and odd.caps.matryoshka_dimensions == (6, 16, 32)
    cases = [  # (engine, params, param, words the message must hold)
        (engine_for(bert_cls), {"dimensions": 16}, "dimensions", ["not a Matryoshka", "32"]),
        (engine_for(matryoshka_model), {"dimensions": 64}, "dimensions", ["64", "1 to 32"]),
        (engine_for(matryoshka_model), {"dimensions": 12}, "dimensions", ["12", "[8, 16, 32]"]),
        (engine_for(matryoshka_model), {"truncate_prompt_tokens": 500}, "truncate_prompt_tokens",
         ["500", "128", "-1 or 1 to 128"]),
        (engine_for(matryoshka_model), {"prompt_name": "nope"}, "prompt_name", ["nope", "passage", "query"]),
        (odd, {"dimensions": 6, "embed_dtype": "binary"}, "embed_dtype", ["binary", "6", "multiple of 8"]),
    ]
    texts = sample_texts(3)
    for engine, params, param, words in cases:
        results = [roundtrip(r) for r in engine.run([req(texts), req(texts, **params), req(texts[:1])])]
        assert results[0].ok and results[2].ok and results[0].shape == (3, engine.caps.embedding_size)
        bad = results[1]
        assert not bad.ok and bad.error_param == param and bad.error_code == "invalid_request"
        for word in words:
            assert word in bad.error_message, (word, bad.error_message)


def test_token_ids_outside_the_vocabulary_are_refused(bert_cls):
    engine = engine_for(bert_cls)
    bad, good = engine.run([req([[1, 2, 10**6]]), req([[2, 7, 3]])])
    assert not bad.ok and "10" in bad.error_message and bad.error_param == "input"
    assert good.ok and good.usage.prompt_tokens == 3


# --- Matryoshka and prompts -----------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [8, 16, 32])
def test_dimensions_is_the_full_vector_cut_and_renormalised(matryoshka_model, dims):
    texts = sample_texts(6, seed=3)
    full = st_reference(matryoshka_model).encode(texts)  # default prompt "query" applies on both sides
    cut = full[:, :dims] / np.linalg.norm(full[:, :dims], axis=-1, keepdims=True)
    ours = embed(matryoshka_model, texts, dimensions=dims).embeddings
    assert ours.shape == (6, dims) and cosines(ours, cut).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1, rtol=1e-6)
    raw = st_reference(matryoshka_model, drop_normalize=True).encode(texts)[:, :dims]
    np.testing.assert_allclose(embed(matryoshka_model, texts, dimensions=dims, use_activation=False).embeddings,
                               raw, rtol=1e-4, atol=1e-5)


def test_prompts_match_sentence_transformers_and_count_in_usage(matryoshka_model):
    engine, texts = engine_for(matryoshka_model), sample_texts(4, seed=5)
    assert engine.caps.default_prompt_name == "query" and engine.caps.prompts["passage"] == "passage: "
    reference = st_reference(matryoshka_model)
    tokenizer = engine.model.tokenizer
    for params, st_kwargs, prefix in [({}, {}, "query: "),
                                      ({"prompt_name": "passage"}, {"prompt_name": "passage"}, "passage: "),
                                      ({"prompt": "topic: "}, {"prompt": "topic: "}, "topic: ")]:
        result = embed(matryoshka_model, texts, **params)
        assert cosines(result.embeddings, reference.encode(texts, **st_kwargs)).min() >= 0.99999
        assert result.usage.prompt_tokens == sum(len(tokenizer(prefix + t)["input_ids"]) for t in texts)


# --- truncation and usage -------------------------------------------------------------------------------

def test_truncation_sides_and_lengths(bert_mean):
    engine = engine_for(bert_mean)
    tokenizer = engine.model.tokenizer
    assert engine.caps.max_model_len == 48  # ST's max_seq_length wins over the 128 positions
    long_text = " ".join(sample_texts(8, seed=11))
    full = tokenizer(long_text)["input_ids"]
    assert len(full) > 48
    # -1 is the model's max length, from the right by default: what sentence-transformers does
    result = embed(bert_mean, [long_text], truncate_prompt_tokens=-1)
    assert result.usage.prompt_tokens == 48
    assert cosines(result.embeddings, st_reference(bert_mean).encode([long_text])).min() >= 0.99999
    for side in ("left", "right"):
        for keep in (5, 20, 48):
            tokenizer.truncation_side = side
            expected = tokenizer(long_text, truncation=True, max_length=keep)["input_ids"]
            tokenizer.truncation_side = "right"
            assert len(expected) == keep and expected[0] == tokenizer.cls_token_id  # specials kept
            text_result = embed(bert_mean, [long_text], truncate_prompt_tokens=keep, truncation_side=side)
            ids_result = embed(bert_mean, [expected])
            assert text_result.usage.prompt_tokens == keep
            np.testing.assert_allclose(text_result.embeddings, ids_result.embeddings, rtol=1e-5, atol=1e-6)
            ids_cut = embed(bert_mean, [full], truncate_prompt_tokens=keep, truncation_side=side)
            plain = full[-keep:] if side == "left" else full[:keep]
            np.testing.assert_allclose(ids_cut.embeddings, embed(bert_mean, [plain]).embeddings, rtol=1e-5)
            assert ids_cut.usage.prompt_tokens == keep
    short = sample_texts(3, seed=12, max_words=5)
    counted = embed(bert_mean, short, truncate_prompt_tokens=40)  # nothing to cut: unchanged
    assert counted.usage.prompt_tokens == sum(len(tokenizer(t)["input_ids"]) for t in short)
    bare = embed(bert_mean, short, add_special_tokens=False)
    assert bare.usage.prompt_tokens == sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in short)


def test_too_long_input_fails_alone(bert_mean):
    long_text = " ".join(sample_texts(8, seed=11))
    ok1, bad, ok2 = [roundtrip(r) for r in engine_for(bert_mean).run(
        [req(["short one"]), req(["fine", long_text]), req(["another"])])]
    assert ok1.ok and ok2.ok and not bad.ok
    assert bad.error_code == "input_too_long" and bad.error_param == "input"
    length = len(engine_for(bert_mean).model.tokenizer(long_text)["input_ids"])
    for word in ("input 1", str(length), "48", "truncate_prompt_tokens=-1"):
        assert word in bad.error_message


# --- output dtypes ----------------------------------------------------------------------------------------

def _expected(floats: np.ndarray, dtype: str) -> np.ndarray:
    from sentence_transformers.util.quantization import quantize_embeddings

    if dtype == "float32":
        return floats
    if dtype == "float16":
        return floats.astype(np.float16)
    if dtype == "bfloat16":
        return float32_to_bfloat16_bits(floats)
    if dtype.startswith("fp8"):  # vLLM's cast: torch's float8 types, stored as their bits
        import torch

        torch_dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[dtype]
        return torch.tensor(floats).to(torch_dtype).view(torch.uint8).numpy()
    return quantize_embeddings(floats, precision=dtype)


@pytest.mark.parametrize("endianness", ["native", "little", "big"])
@pytest.mark.parametrize("embed_dtype", EMBED_DTYPES)
def test_every_dtype_and_byte_order_round_trips(bert_dense_normalize, embed_dtype, endianness):
    texts = sample_texts(5, seed=9)
    floats = embed(bert_dense_normalize, texts).embeddings
    result = roundtrip(embed(bert_dense_normalize, texts, embed_dtype=embed_dtype, endianness=endianness))
    assert result.embed_dtype == embed_dtype and result.endianness in ("little", "big")
    np.testing.assert_array_equal(result.stored, _expected(floats, embed_dtype))
    width = 24 // 8 if embed_dtype in ("binary", "ubinary") else 24
    assert result.shape == (5, width)


float_rows = arrays(np.float32, st.tuples(st.integers(2, 8), st.sampled_from([8, 16, 24])),
                    elements=st.floats(-4, 4, width=32))


@settings(max_examples=60, deadline=None)
@given(float_rows, st.sampled_from(["int8", "uint8", "binary", "ubinary"]))
def test_quantisation_equals_sentence_transformers(rows, precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    np.testing.assert_array_equal(cast(rows, precision), quantize_embeddings(rows, precision=precision))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.just(1), st.sampled_from([8, 16])), elements=st.floats(-1, 1, width=32)),
       st.sampled_from(["int8", "uint8"]))
def test_single_row_quantisation_uses_a_symmetric_range(row, precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    expected = quantize_embeddings(row, precision=precision, ranges=quantization_ranges(row))
    np.testing.assert_array_equal(cast(row, precision), expected)


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 16)),
              elements=st.floats(width=32, allow_nan=False)))
def test_float_casts_round_to_nearest(rows):
    import torch

    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(cast(rows, "float16"), rows.astype(np.float16))
    torch_bf16 = torch.from_numpy(rows).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(cast(rows, "bfloat16"), torch_bf16)


# --- batching and failures --------------------------------------------------------------------------------

def test_many_small_requests_share_forward_passes(bert_dense_normalize):
    engine = Engine(load_model(bert_dense_normalize), max_batch_tokens=512, max_batch_size=16)
    texts = sample_texts(40, seed=21)
    requests = [req(texts[i:i + 2]) for i in range(0, 40, 2)]
    results = engine.run(requests)
    assert all(r.ok for r in results) and len(results) == 20
    assert 1 <= engine.forward_passes < len(requests)
    for request, result in zip(requests, results):
        alone = embed(bert_dense_normalize, request.inputs).embeddings
        np.testing.assert_allclose(result.embeddings, alone, rtol=1e-4, atol=1e-5)
        assert result.id == request.id


def test_budget_splits_batches(bert_cls):
    engine = Engine(load_model(bert_cls), max_batch_tokens=64, max_batch_size=4)
    engine.run([req(sample_texts(12, seed=2))])
    assert engine.forward_passes >= 3  # at most 4 rows per pass


def test_a_failing_forward_pass_fails_only_its_batch(bert_cls, caplog):
    engine = Engine(load_model(bert_cls), max_batch_size=1)
    real = engine.model.embed

    def flaky(token_lists, prompt_lengths=None):
        if any(len(ids) == 7 for ids in token_lists):
            raise RuntimeError("device fell over")
        return real(token_lists, prompt_lengths)

    engine.model.embed = flaky
    results = engine.run([req([[2, 5, 6, 3]]), req([[2, 5, 6, 7, 8, 9, 3]]), req([[2, 9, 3]])])
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error_code == "internal_error" and "device fell over" in results[1].error_message
    assert "forward pass" in caplog.text


# --- the real model --------------------------------------------------------------------------------------

def test_minilm_matches_sentence_transformers(minilm_path):
    from sentence_transformers import SentenceTransformer

    engine = Engine(load_model(minilm_path, served_name="all-MiniLM-L6-v2"), max_batch_tokens=4096)
    rng = np.random.default_rng(0)
    base = sample_texts(60, seed=31, max_words=40)
    long_texts = [" ".join(rng.choice(base, 20)) for _ in range(4)]  # well past 256 tokens
    texts = base[:52] + long_texts
    results = engine.run([req(texts[:20], truncate_prompt_tokens=-1), req(texts[20:], truncate_prompt_tokens=-1),
                          req([base[0], long_texts[0]]), req(base[:3])])
    reference = SentenceTransformer(minilm_path, device="cpu").encode(texts, batch_size=16)
    ours = np.vstack([results[0].embeddings, results[1].embeddings])
    assert ours.shape == (56, 384) and cosines(ours, reference).min() >= 0.99999
    assert results[0].model == "all-MiniLM-L6-v2"
    assert not results[2].ok and results[2].error_code == "input_too_long"
    assert "input 1" in results[2].error_message and "256" in results[2].error_message
    assert results[3].ok
    tokenizer = engine.model.tokenizer
    assert results[0].usage.prompt_tokens == sum(min(256, len(tokenizer(t)["input_ids"])) for t in texts[:20])


def test_bfloat16_on_cpu_passes_the_fidelity_check_and_matches_float32(minilm_path):
    texts = sample_texts(24, seed=3)
    full = Engine(load_model(minilm_path))
    half = Engine(load_model(minilm_path, dtype="bfloat16"))
    assert next(half.model.module.parameters()).dtype == torch.bfloat16
    assert half.model.fidelity >= 0.999
    request = EmbedRequest(model=full.caps.name, inputs=texts)
    reference, reduced = (e.run([request])[0].embeddings for e in (full, half))
    assert cosines(reference, reduced).min() >= 0.995


def test_a_model_failing_the_fidelity_check_is_refused_and_left_in_float32(bert_mean):
    model = load_model(bert_mean)
    with pytest.raises(ValueError, match=r"in bfloat16 agrees with float32 only to cosine .* serve it in float32"):
        cast_with_fidelity_check(model, torch.bfloat16, min_cosine=1.000001)
    assert next(model.module.parameters()).dtype == torch.float32


def test_a_model_that_overflows_in_float16_is_refused_not_served_as_nan(tmp_path):
    """Its float16 vectors are NaN, and a NaN cosine compares false with any gate: it passed the check before."""
    from embedfleet.common.errors import StartupError
    from tests.tinymodels import save_float16_overflowing_bert

    folder = save_float16_overflowing_bert(str(tmp_path / "overflow"))
    exact = load_model(folder, device="cpu")
    assert torch.isfinite(exact.embed([exact.tokenizer("the quick brown fox")["input_ids"]])).all()
    with pytest.raises(StartupError, match=r"in float16 agrees with float32 only to cosine NaN: its vectors overflow"):
        load_model(folder, device="cpu", dtype="float16")


def test_a_row_whose_vector_is_not_finite_fails_its_request_alone(tmp_path):
    """Token 40's embedding is 3e38: any text holding it gives NaN (LayerNorm's mean overflows), in float32 too.
    Its request fails with a message; its batch-mates, a duplicate of a clean row included, are answered."""
    import torch
    from transformers import BertModel

    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    folder = save_tiny_bert(str(tmp_path / "inf"))
    module = BertModel.from_pretrained(folder)
    with torch.no_grad():
        module.embeddings.word_embeddings.weight[40] = 3e38
    module.save_pretrained(folder)
    engine = Engine(load_model(wrap_sentence_transformers(folder, "mean"), device="cpu"))
    requests = [req([[2, 10 + i, 3]]) for i in range(4)]
    requests.insert(2, req([[2, 12, 3], [2, 40, 12, 3]]))
    results = engine.run(requests)
    assert [r.ok for r in results] == [True, True, False, True, True]
    assert results[2].error_code == "internal_error"
    assert "output for this input is not finite (inf or NaN)" in results[2].error_message
    assert all(np.isfinite(r.embeddings).all() for r in results if r.ok)


# --- a failed forward pass is retried in halves --------------------------------------------------------

def test_a_failed_pass_is_retried_in_halves_so_only_the_poisoned_request_fails(bert_cls):
    from tests.faultymodels import PoisonedModel

    engine = Engine(PoisonedModel.of(load_model(bert_cls)))
    requests = [req([[2, 10 + i, 3], [2, 40 + i, 3]]) for i in range(7)]
    requests.insert(3, req([[2, 12, 3], [2, PoisonedModel.POISON, 12, 3]]))
    results = engine.run(requests)
    assert [r.ok for r in results] == [True] * 3 + [False] + [True] * 4
    assert results[3].error_code == "internal_error" and "crashes the kernel" in results[3].error_message
    clean = engine_for(bert_cls)
    for request, result in zip(requests, results):
        if result.ok:
            np.testing.assert_allclose(result.embeddings, clean.run([request])[0].embeddings, rtol=1e-4, atol=1e-5)


def test_a_batch_too_big_for_the_device_still_runs_in_smaller_passes(bert_cls):
    from tests.faultymodels import FaultyModel

    class SmallDevice(FaultyModel):
        def embed(self, token_lists, prompt_lengths=None):
            if len(token_lists) > 3:
                raise RuntimeError("CUDA out of memory")
            return super().embed(token_lists, prompt_lengths)

    engine = Engine(SmallDevice.of(load_model(bert_cls)))
    requests = [req(sample_texts(5, seed=41)), req(sample_texts(4, seed=42))]
    results = engine.run(requests)
    assert all(r.ok for r in results) and engine.forward_passes > 3
    clean = engine_for(bert_cls)
    for request, result in zip(requests, results):
        np.testing.assert_allclose(result.embeddings, clean.run([request])[0].embeddings, rtol=1e-4, atol=1e-5)


def test_the_engine_runs_with_no_redis_at_all(tmp_path):
    """The model side imports neither redis nor rq, and a fresh process runs a round through it with no
    Redis anywhere (the cache and in-flight dedup are the serving side's: worker/serving/steps.py)."""
    import subprocess
    import sys

    from tests.commands import ROOT
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path / "m")), "mean", normalize=True)
    script = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('redis', 'rq'): raise ImportError('the engine imported ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "from embedfleet.common.request import EmbedRequest\n"
        "from embedfleet.worker.engine.engine import Engine\n"
        "from embedfleet.worker.engine.models.loader import load_model\n"
        f"engine = Engine(load_model({folder!r}, served_name='m'))\n"
        "results = engine.run([EmbedRequest(model='m', inputs=['no redis here', 'none at all'])])\n"
        "assert results[0].ok and results[0].embeddings.shape == (2, 32), results\n"
        "print('ok', engine.forward_passes)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and done.stdout.startswith("ok 1"), done.stderr[-2000:]
