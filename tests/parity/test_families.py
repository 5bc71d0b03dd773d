"""Every architecture family sentence-transformers serves, exactly: a tiny random folder per family (saved by the
installed sentence-transformers, tests/stfamilies.py) served by a real BatchWorker over a real redis-server and
compared with `SentenceTransformer(folder).encode` at min cosine >= 0.99999, on torch and, for the families
they export, on the ONNX Runtime and OpenVINO engines (the matrix in docs/models.md). Folders the worker
cannot serve exactly are refused at start in one line naming the folder and the reason."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from embedfleet.common.errors import StartupError
from embedfleet.common.request import EmbedRequest
from embedfleet import Producer
from tests.harness import Fleet
from tests.stfamilies import FAMILIES, FLAT_TEMPLATE, build, save_family, with_template
from tests.tinymodels import cosines, sample_texts, wrap_sentence_transformers
from embedfleet.worker.engine.backends import EngineChoice
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.preprocess import prepare

MIN_COSINE = 0.99999
# Short and mixed texts, unicode, code, whitespace, and inputs over every folder's max length (truncated by
# both sides: truncate_prompt_tokens=-1 is what ST's encode does).
TEXTS = sample_texts(40, seed=7) + [
    "x", "  padded   with   spaces  ", "UPPER lower MiXeD", "héllo wörld — ✓ 日本語 😀", "Ünïcödé çåfé naïve",
    "def add(a, b):\n    return a + b  # sum", "SELECT * FROM t WHERE id = 42;", "1, 2, 3.5e-4, -7, 0x1F",
    " ".join(sample_texts(30, seed=11)), "river " * 300, "[CLS] [SEP] <s> </s> <pad> <|endoftext|>"]
# (family, engine): what the CPU engines export, kept to a few folders each (an export costs seconds).
ENGINE_MATRIX = [("bert_cls_mean", "onnx"), ("roberta", "onnx"), ("distilbert", "onnx"), ("mpnet", "onnx"),
                 ("t5_encoder", "onnx"), ("qwen3_last", "onnx"), ("chat_bert_flat", "onnx"),
                 ("xlmr", "openvino"), ("t5_encoder", "openvino"), ("chat_qwen3_last", "openvino")]


def _params(name: str) -> dict:
    """The request's fields: truncation as ST's encode, and the folder's prompt where it has one (a default
    prompt is left to the folder, on both sides)."""
    options = FAMILIES[name][2]
    named = "prompts" in options and not options.get("default_prompt_name")
    return {"truncate_prompt_tokens": -1, **({"prompt_name": "query"} if named else {})}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {name: build(name, str(tmp_path_factory.mktemp(name))) for name in FAMILIES}


@functools.cache
def _reference(folder: str, prompt_name: str | None) -> np.ndarray:
    """ST's vectors, one text at a time (its batched decoder output moves with the left padding; the worker's
    explicit position ids do not)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu")
    if model.tokenizer.pad_token is None:
        model.tokenizer.pad_token = model.tokenizer.eos_token
    return model.encode(TEXTS, batch_size=1, prompt_name=prompt_name)


def reference(folders: dict, name: str) -> np.ndarray:
    return _reference(folders[name], _params(name).get("prompt_name"))


@contextlib.contextmanager
def serving(redis_url: str, models: dict) -> Iterator[Producer]:
    """A BatchWorker thread per loaded model (served under its dict key), and a Producer on the same Redis."""
    with Fleet(redis_url) as fleet:
        for model in models.values():
            fleet.serve(Engine(model, max_batch_tokens=2048, max_batch_size=16))
        yield fleet.producer


@pytest.fixture(scope="module")
def every_family(folders, redis_server):
    """Every family on the torch engine, one worker each, all in this process."""
    redis.Redis.from_url(redis_server.url).flushall()
    with serving(redis_server.url, {name: load_model(folder, served_name=name)
                                    for name, folder in folders.items()}) as producer:
        yield producer


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_sentence_transformers_on_torch(every_family, folders, name):
    vectors = every_family.embed(TEXTS, name, **_params(name))
    expected = reference(folders, name)
    assert vectors.shape == expected.shape
    assert cosines(vectors, expected).min() >= MIN_COSINE


@pytest.fixture(scope="module")
def engine_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("engine_cache"))


@pytest.mark.parametrize(("name", "engine"), ENGINE_MATRIX)
def test_family_matches_sentence_transformers_on_a_cpu_engine(folders, redis_server, engine_cache, name, engine):
    model = load_model(folders[name], served_name=f"{name}-{engine}",
                       engine=EngineChoice(engine, cache_dir=engine_cache))
    assert model.engine == engine
    with serving(redis_server.url, {name: model}) as producer:
        vectors = producer.embed(TEXTS, f"{name}-{engine}", **_params(name))
    assert cosines(vectors, reference(folders, name)).min() >= MIN_COSINE


def test_the_t5_folders_load_the_encoder_alone(every_family, folders):
    from transformers import T5EncoderModel

    for name in ("t5_encoder", "t5_full"):
        assert type(load_model(folders[name]).module) is T5EncoderModel


def test_plain_text_on_a_message_folder_is_rendered_through_the_template(folders):
    """The rows are the template's rendering of one user message, tokenised without added specials; a prompt
    is a system message in front; a truncated row keeps the template's tail (here [SEP])."""
    model = load_model(folders["chat_bert_flat"])
    tokenizer = model.tokenizer
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "rain today"}], tokenize=False)
    assert rendered.startswith("[CLS]") and rendered.endswith("[SEP]")
    prepared = prepare(model, EmbedRequest(model="m", inputs=["rain today"]))
    assert prepared.token_lists == [tokenizer(rendered, add_special_tokens=False)["input_ids"]]
    long = prepare(model, EmbedRequest(model="m", inputs=["river " * 300], params={"truncate_prompt_tokens": -1}))
    assert len(long.token_lists[0]) == model.caps.max_model_len and long.token_lists[0][-1] == tokenizer.sep_token_id
    prompted = load_model(folders["chat_bert_structured"])
    request = EmbedRequest(model="m", inputs=["rain today"], params={"prompt_name": "query"})
    text = prompted.tokenizer.decode(prepare(prompted, request).token_lists[0])
    assert text.startswith("[CLS] system : find :") and "user : rain today" in text


def test_raw_text_keeps_vllms_handling(folders):
    """load_model(raw_text=True) (--raw-text): a plain string is tokenised as it is, special tokens added."""
    model = load_model(folders["chat_bert_flat"], raw_text=True)
    assert model.plain_text is None
    prepared = prepare(model, EmbedRequest(model="m", inputs=["rain today"]))
    assert prepared.token_lists == [model.tokenizer("rain today")["input_ids"]]


def test_a_template_without_the_message_entry_stays_text_only(tmp_path):
    """A chat template added after sentence-transformers saved the folder (no `message` in modality_config): ST
    keeps encoding plain strings as text, and so does the worker."""
    folder = wrap_sentence_transformers(save_family("bert", str(tmp_path / "bert")), "mean")
    with_template(folder, FLAT_TEMPLATE)
    model = load_model(folder)
    assert model.plain_text is None and model.caps.has_chat_template
    result = Engine(model).run([EmbedRequest(model="m", inputs=TEXTS, params={"truncate_prompt_tokens": -1})])[0]
    assert cosines(result.embeddings, _reference(folder, None)).min() >= MIN_COSINE


def _edit_json(path: str, **changes) -> None:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    data.update(changes)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({k: v for k, v in data.items() if v is not None}, handle)


def _broken(folders: dict, tmp_path, how: str, classifier: str = "") -> str:
    """A copy of a family folder made unservable in one way."""
    source = classifier or folders["chat_bert_flat" if how in ("no_template", "bad_template") else "bert_mean"]
    folder = str(tmp_path / how)
    shutil.copytree(source, folder)
    bert = os.path.join(folder, "sentence_bert_config.json")
    if how == "module":
        with open(os.path.join(folder, "modules.json"), encoding="utf-8") as handle:
            modules = json.load(handle)
        modules.append({"idx": 9, "name": "9", "path": "9_LSTM", "type": "sentence_transformers.models.LSTM"})
        with open(os.path.join(folder, "modules.json"), "w", encoding="utf-8") as handle:
            json.dump(modules, handle)
    elif how == "image_only":
        _edit_json(bert, modality_config={"image": {"method": "forward", "method_output_name": "last_hidden_state"}})
    elif how == "processing":
        _edit_json(bert, processing_kwargs={"text": {"max_length": 8}})
    elif how == "no_template":
        os.remove(os.path.join(folder, "chat_template.jinja"))
    elif how == "bad_template":
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as handle:
            handle.write("{{ raise_exception('this template takes no plain text') }}")
    elif how == "chat_classifier":
        forward = {"method": "forward", "method_output_name": "logits"}
        with open(bert, "w", encoding="utf-8") as handle:
            json.dump({"transformer_task": "sequence-classification",
                       "modality_config": {"text": forward, "message": {**forward, "format": "flat"}}}, handle)
        with_template(folder, FLAT_TEMPLATE)
    elif how == "audio":
        _edit_json(os.path.join(folder, "config.json"), model_type="whisper")
    return folder


@pytest.mark.parametrize(("how", "words"), [
    ("module", "sentence-transformers module 'sentence_transformers.models.LSTM' cannot be served"),
    ("image_only", "modality_config ['image'] (no text input)"),
    ("processing", "processing_kwargs ['text']"),
    ("no_template", "its tokenizer has no chat template"),
    ("audio", "model type 'whisper' is not served"),
    ("chat_classifier", "renders its inputs as chat messages is not served exactly"),
    ("bad_template", "fails on a test input: ValidationError: the model's chat template cannot render"),
])
def test_a_folder_that_cannot_be_served_exactly_is_refused_in_one_line(folders, cross_encoder, tmp_path, how,
                                                                       words):
    folder = _broken(folders, tmp_path, how, cross_encoder if how == "chat_classifier" else "")
    with pytest.raises(StartupError) as refused:
        load_model(folder)
    message = str(refused.value)
    assert folder in message and words in message and "\n" not in message


def test_the_worker_refuses_it_at_start_in_one_line(folders, redis_url, tmp_path):
    """The command line: exit 1 with one `embedfleet: model folder ...` line, never "unexpected ... report it"."""
    from tests.commands import assert_one_line_error, clean_env, embedfleet

    folder = _broken(folders, tmp_path, "module")
    done = embedfleet("worker", "--model", folder, "--redis-url", redis_url, env=clean_env(tmp_path))
    assert_one_line_error(done, 1, f"model folder {folder}", "cannot be served")
    assert "unexpected" not in done.stderr
