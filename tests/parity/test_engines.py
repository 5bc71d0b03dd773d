"""CPU engines (worker/engine/backends): ONNX Runtime and OpenVINO, float32 and int8, against sentence-transformers
in float32 on the bundled MiniLM and tiny random models; the fidelity gate, the export cache, the refusals, and a
real `python -m embedfleet.worker --engine onnx` serving through a real gateway."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from embedfleet.common.errors import StartupError
from embedfleet.common.request import EmbedRequest
from tests.tinymodels import cosines, sample_texts, save_tiny_bert, st_reference, wrap_sentence_transformers
from embedfleet.worker.engine.backends import GATES, EngineChoice, export
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.engine.models.loader import load_model

# `make install` installs the [onnx] and [openvino] extras: a missing one is an install defect, not a skip
import onnxruntime  # noqa: F401
import openvino  # noqa: F401

ENGINES = [("onnx", None), ("onnx", "int8"), ("openvino", None), ("openvino", "int8")]
TEXTS = sample_texts(24, seed=3) + ["x", "Paris is the capital of France.", "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module", autouse=True)
def _torch_threads():
    """A CPU engine leaves torch one thread (worker/engine/backends attach); later test modules get theirs back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("engine-cache"))


@pytest.fixture(scope="module")
def cls_dense(tmp_path_factory) -> str:
    """BERT -> CLS pooling -> Dense(32->24, Tanh), no Normalize."""
    return wrap_sentence_transformers(save_tiny_bert(str(tmp_path_factory.mktemp("cls_dense")), seed=2), "cls",
                                      dense=True)


@pytest.fixture(scope="module")
def folders(minilm_path, bert_mean, cls_dense, decoder_lasttoken) -> dict[str, str]:
    return {"minilm": minilm_path, "bert_mean": bert_mean, "cls_dense": cls_dense, "qwen2_last": decoder_lasttoken}


@functools.cache
def _loaded(folder: str, engine: str, quantize: str | None, cache_dir: str):
    return load_model(folder, served_name="m", engine=EngineChoice(engine, quantize, cache_dir=cache_dir))


@functools.cache
def _reference(folder: str) -> np.ndarray:
    return st_reference(folder).encode(TEXTS, convert_to_numpy=True, batch_size=8)


@pytest.mark.parametrize("model", ["minilm", "bert_mean", "cls_dense", "qwen2_last"])
@pytest.mark.parametrize(("engine", "quantize"), ENGINES)
def test_engine_agrees_with_sentence_transformers_at_its_gate(folders, engine_cache, model, engine, quantize):
    folder = folders[model]
    loaded = _loaded(folder, engine, quantize, engine_cache)
    assert loaded.engine == engine + (f"-{quantize}" if quantize else "")
    assert loaded.backend is not None and GATES[quantize] <= loaded.fidelity <= 1.000001
    result = Engine(loaded, max_batch_tokens=512).run([EmbedRequest(model="m", inputs=TEXTS)])[0]
    result.raise_for_error()
    agreement = cosines(result.embeddings, _reference(folder))
    if quantize is None:  # the same function, summed in another order: every text at the gate
        assert agreement.min() >= GATES[None]
    else:  # int8 is an approximation: the gate holds on average over texts it was not calibrated on; a text
        # that is mostly outliers (MiniLM's "x") may sit lower, bounded here
        assert agreement.mean() >= GATES[quantize] and agreement.min() >= 0.98


def test_every_task_reads_the_engine(folders, engine_cache):
    """token_embed (per-token hidden states) runs on the engine as embed does: same rows as torch's."""
    torch_model = load_model(folders["bert_mean"], served_name="m")
    onnx_model = _loaded(folders["bert_mean"], "onnx", None, engine_cache)
    request = EmbedRequest(model="m", inputs=TEXTS[:3], params={"task": "token_embed", "use_activation": False})
    want, got = (Engine(m).run([request])[0] for m in (torch_model, onnx_model))
    for a, b in zip(want.embeddings, got.embeddings):
        np.testing.assert_allclose(a, b, atol=2e-5)


def _broken_copy(folder: str, target, engine: str) -> str:
    """The folder with a shipped export that is subtly wrong (one layer's FFN weights off by a little noise: a
    stale export of an earlier checkpoint, a bad conversion) -- close to the model, but not the same function."""
    import torch
    from transformers import AutoModel

    copy = shutil.copytree(folder, target / "model")
    model = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        weight = model.encoder.layer[0].intermediate.dense.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * weight.std() * 3)
    other = str(target / "other")
    model.save_pretrained(other)
    os.makedirs(copy / "onnx")
    export.export_onnx(other, str(copy / "onnx" / "model.onnx"), left_padding=False)
    if engine == "openvino":
        import openvino as ov

        model = ov.Core().read_model(str(copy / "onnx" / "model.onnx"))
        shutil.rmtree(copy / "onnx")
        ov.save_model(model, str(copy / "openvino" / "openvino_model.xml"), compress_to_fp16=False)
    return str(copy)


@pytest.mark.parametrize("engine", ["onnx", "openvino"])
def test_the_gate_refuses_a_broken_export_in_one_line(bert_mean, tmp_path, engine):
    broken = _broken_copy(bert_mean, tmp_path, engine)
    with pytest.raises(StartupError) as refused:
        load_model(broken, served_name="m", engine=EngineChoice(engine, cache_dir=str(tmp_path / "cache")))
    message = str(refused.value)
    assert "\n" not in message and f"--engine {engine} agrees with float32 torch only to cosine" in message
    assert "the gate is 0.99999" in message and "--engine torch" in message
    # A gate set low enough lets the same export serve (the flag is the way to accept a known difference).
    loaded = load_model(broken, served_name="m", engine=EngineChoice(engine, gate=0.9,
                                                                       cache_dir=str(tmp_path / "cache")))
    assert 0.9 <= loaded.fidelity < 0.99999 and "shipped" in loaded.backend.describe()


def test_a_shipped_export_is_used_as_is(bert_mean, tmp_path):
    copy = shutil.copytree(bert_mean, tmp_path / "model")
    os.makedirs(copy / "onnx")
    export.export_onnx(bert_mean, str(copy / "onnx" / "model.onnx"), left_padding=False)
    loaded = load_model(str(copy), served_name="m", engine=EngineChoice("onnx", cache_dir=str(tmp_path / "cache")))
    assert loaded.backend.path == str(copy / "onnx" / "model.onnx") and loaded.fidelity >= GATES[None]
    assert not os.path.exists(tmp_path / "cache")  # nothing exported


def test_the_cache_keeps_engines_apart_and_exports_once(bert_mean, engine_cache, monkeypatch):
    paths = {(e, q): _loaded(bert_mean, e, q, engine_cache).backend.path for e, q in ENGINES}
    assert len({os.path.dirname(p) for p in paths.values()}) == len(ENGINES)  # a folder per engine/quantisation
    assert all(p.startswith(engine_cache) for p in paths.values())
    # The vector cache's model identity: torch keeps the one it had before engines; each engine has its own.
    digest = folder_digest(bert_mean)
    identities = {label: model_identity("m", digest, "float32", "cpu", label)
                  for label in ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8")}
    assert len(set(identities.values())) == 5
    assert identities["torch"] == model_identity("m", digest, "float32", "cpu")
    # A second start finds the export in the cache: nothing is exported again.
    monkeypatch.setattr(export, "export_onnx", lambda *a, **k: pytest.fail("exported again"))
    again = load_model(bert_mean, served_name="m", engine=EngineChoice("onnx", cache_dir=engine_cache))
    assert again.backend.path == paths[("onnx", None)]


@pytest.mark.parametrize(("choice", "kwargs", "words"), [
    (EngineChoice("torch", "int8"), {}, "--quantize int8 needs --engine onnx or --engine openvino"),
    (EngineChoice("onnx"), {"dtype": "bfloat16"}, "--dtype bfloat16 is for --engine torch"),
    (EngineChoice("openvino"), {"device": "cuda"}, "runs on the CPU"),
])
def test_what_an_engine_cannot_serve_is_refused_in_one_line(bert_mean, choice, kwargs, words):
    with pytest.raises(StartupError, match=words) as refused:
        load_model(bert_mean, engine=choice, **kwargs)
    assert "\n" not in str(refused.value)


def test_a_classifier_is_refused_on_a_cpu_engine(cross_encoder):
    with pytest.raises(StartupError, match="serves embedding models.*serve it with --engine torch"):
        load_model(cross_encoder, engine=EngineChoice("onnx"))


def test_cli_refuses_an_unknown_engine_or_quantisation():
    from tests.commands import ROOT

    for flags in (["--engine", "tensorrt"], ["--quantize", "int4"]):
        done = subprocess.run([sys.executable, "-m", "embedfleet.worker", *flags], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and flags[0].strip("-") in done.stderr


def test_a_worker_started_with_engine_onnx_serves_end_to_end(bert_mean, engine_cache, redis_url, tmp_path):
    """`python -m embedfleet.worker --engine onnx` (export from the cache the tests above filled), a real gateway, the
    openai client: the vectors are sentence-transformers' and the advert names the engine and its measured cosine."""
    import openai

    from embedfleet import Producer
    from tests.commands import ROOT, advertised, clean_env
    from tests.gatewayserver import Server, settings

    env = {**clean_env(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model",
                               bert_mean, "--served-model-name", "tiny", "--engine", "onnx", "--engine-cache-dir",
                               engine_cache, "--poll-timeout", "1", "--probe-seconds", "1"], env=env)
    gateway = Server(settings(redis_url))
    try:
        with Producer(redis_url) as producer:
            info = advertised(producer, "tiny", worker)
            assert info["engine"] == "onnx" and info["fidelity"] >= GATES[None]
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none")
            answer = client.embeddings.create(model="tiny", input=TEXTS[:5])
        got = np.array([item.embedding for item in answer.data])
        assert cosines(got, _reference(bert_mean)[:5]).min() >= GATES[None]
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(30)
    json.dumps(info)  # the advert is plain data
