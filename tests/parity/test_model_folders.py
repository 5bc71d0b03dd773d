"""A model folder that is quietly wrong is refused at start, in one line naming the folder and what is wrong, never
served with wrong vectors: real copies of the bundled all-MiniLM-L6-v2 folder (and of tiny test folders) with
files removed or altered, loaded as the worker loads them, and a real worker process on the worst case."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from embedfleet.common.errors import StartupError
from embedfleet.common.protocol import enqueueing, keys, rqkeys
from embedfleet.common.request import EmbedRequest
from tests.commands import ROOT, clean_env
from tests.tinymodels import _bert_vocab
from embedfleet.worker.engine.models.loader import load_model

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


@pytest.fixture
def copy(tmp_path, minilm_path):
    """A fresh copy of the bundled model's folder, to break."""
    folder = tmp_path / "minilm-copy"
    shutil.copytree(minilm_path, folder)
    return folder


def refusal(folder) -> str:
    with pytest.raises(StartupError) as caught:
        load_model(str(folder), device="cpu")
    message = str(caught.value)
    assert message.startswith(f"model folder {folder}") and "\n" not in message, message
    return message


def test_a_worker_on_a_folder_without_its_tokenizer_exits_with_the_line_and_answers_nothing(copy, redis_url,
                                                                                          redis_client, tmp_path):
    """The issue's case: the worker started (transformers built an empty BertTokenizer: "The cat sits on the mat."
    read as [CLS] [UNK] x7 [SEP], unrelated texts at cosine 0.993) and answered and cached the queued requests."""
    for name in TOKENIZER_FILES:
        os.remove(copy / name)
    queued = EmbedRequest(model="broken", inputs=["The cat sits on the mat."])
    enqueueing.enqueue(redis_client, enqueueing.enqueue_args(keys.queue_name("broken"), [queued]))
    done = subprocess.run([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", str(copy),
                           "--served-model-name", "broken", "--poll-timeout", "1", "--probe-seconds", "0.2"],
                          env=clean_env(tmp_path / "xdg"), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"embedfleet: model folder {copy}: no tokenizer files (one of tokenizer.json, "
                           "vocab.txt is needed"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not redis_client.exists(keys.model_workers_key("broken"))  # never advertised
    assert redis_client.lrange(rqkeys.rq_queue_key(keys.queue_name("broken")), 0, -1) == [queued.id.encode()]
    assert not redis_client.exists(keys.result_key(queued.id))  # still queued, for a sound worker


def test_a_vocabulary_that_reads_the_probe_texts_as_unknown_is_refused(copy, minilm_path):
    """A vocab.txt cut to its first 1,000 lines ([unused] tokens and specials): every probe word is [UNK]."""
    os.remove(copy / "tokenizer.json")
    with open(os.path.join(minilm_path, "vocab.txt"), encoding="utf-8") as handle:
        lines = handle.readlines()[:1000]
    (copy / "vocab.txt").write_text("".join(lines), encoding="utf-8")
    message = refusal(copy)
    assert "its tokenizer reads 100% of the probe texts' 86 tokens as the unknown token '[UNK]' (at most 50% " \
           "is allowed" in message


def test_another_models_smaller_vocabulary_is_refused(copy):
    """The tests' 166-token WordPiece spells the probe texts out of characters (1% unknown): only its size gives
    it away against MiniLM's 30,522 embedding rows."""
    os.remove(copy / "tokenizer.json")
    vocab = _bert_vocab()
    (copy / "vocab.txt").write_text("".join(token + "\n" for token in sorted(vocab, key=vocab.get)), encoding="utf-8")
    assert "its tokenizer has 166 tokens but the model's embedding matrix has 30522 rows" in refusal(copy)


def test_token_ids_past_the_embedding_matrix_are_refused(copy):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(copy))
    tokenizer.add_tokens(["embedfleetword"])  # id 30522: MiniLM's matrix has rows 0-30521
    tokenizer.save_pretrained(str(copy))
    assert "its tokenizer gives token ids up to 30522 but the model's embedding matrix has 30522 rows" \
        in refusal(copy)


def test_a_checkpoint_that_lacks_weights_is_refused(copy):
    """transformers fills the missing layer with random values and only logs it."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(copy / "model.safetensors"))
    save_file({name: tensor for name, tensor in weights.items() if ".layer.5." not in name},
              str(copy / "model.safetensors"), metadata={"format": "pt"})
    message = refusal(copy)
    assert "its checkpoint lacks 16 weights of the model (encoder.layer.5." in message
    assert "which transformers would fill with random values" in message


def test_a_max_seq_length_past_the_position_table_is_refused(copy):
    """Every input of 513-1,024 tokens failed in the forward pass ("The expanded size of the tensor (702) ...")."""
    (copy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024, "do_lower_case": False}))
    assert "max length 1024 (max_seq_length in sentence_bert_config.json) is more than the model's 512 " \
           "positions" in refusal(copy)


def test_a_missing_pooling_module_is_refused_not_pooled_by_default(tmp_path, bert_cls):
    """A CLS-pooling folder without 1_Pooling was served with mean pooling (the default for an empty config)."""
    folder = tmp_path / "cls-copy"
    shutil.copytree(bert_cls, folder)
    shutil.rmtree(folder / "1_Pooling")
    assert "modules.json names a Pooling module at '1_Pooling', which is not there" in refusal(folder)


def test_a_dense_module_without_its_weights_is_refused(tmp_path, bert_dense_normalize):
    folder = tmp_path / "dense-copy"
    shutil.copytree(bert_dense_normalize, folder)
    dense = json.loads((folder / "modules.json").read_text())[2]["path"]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / dense / name).exists():
            os.remove(folder / dense / name)
    assert f"modules.json names a Dense module at '{dense}' without its weights (model.safetensors or " \
           "pytorch_model.bin)" in refusal(folder)


def test_a_modules_json_entry_without_a_type_is_refused(copy):
    (copy / "modules.json").write_text(json.dumps([{"idx": 0, "path": ""}]))
    assert "modules.json is not a list of modules each with a `type`" in refusal(copy)


@pytest.mark.parametrize("kept", ["tokenizer.json", "vocab.txt"])
def test_either_tokenizer_file_alone_serves_the_models_own_vectors(copy, kept, minilm_engine):
    """The checks ask for the folder's own tokenizer, not for every file of it."""
    import numpy as np

    for name in TOKENIZER_FILES:
        if name != kept:
            os.remove(copy / name)
    model = load_model(str(copy), device="cpu")
    texts = ["The cat sits on the mat.", "Quarterly revenue grew by 12 percent."]
    ids = [model.tokenizer(text)["input_ids"] for text in texts]
    assert ids == [minilm_engine.model.tokenizer(text)["input_ids"] for text in texts]
    np.testing.assert_allclose(model.embed(ids).numpy(), minilm_engine.model.embed(ids).numpy(), atol=1e-5)
