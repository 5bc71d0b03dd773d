"""Tiny random models saved as sentence-transformers folders, built offline for tests (no hub).

Builders write a folder and return its path; the session fixtures at the bottom build each flavour once.
Its fixtures reach every test module through `pytest_plugins` in tests/conftest.py.
"""

from __future__ import annotations

import functools
import json
import os
import random
import string

import pytest

WORDS = (
    "the a of to and in is it that for on with as was at by be this from or an are not but have "
    "model vector token batch queue worker redis embed text query passage search paris london "
    "weather today sunny rain cloud river mountain coffee tea bread music piano guitar city night "
    "morning quick brown fox jumps over lazy dog data science learning deep network layer"
).split()
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SEED_SENTENCES = [" ".join(WORDS[i:i + 9]) for i in range(0, len(WORDS), 9)]


def sample_texts(count: int, seed: int = 0, max_words: int = 30) -> list[str]:
    """Mixed-length sentences from the tiny vocabulary, with some punctuation and casing."""
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        words = rng.choices(WORDS, k=rng.randint(1, max_words))
        text = " ".join(words)
        texts.append(text.capitalize() + ("." if i % 3 else "!"))
    return texts


def _bert_vocab() -> dict[str, int]:
    """A WordPiece vocabulary: specials, the corpus words, single characters and '##' continuations."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = BERT_SPECIALS + sorted(set(WORDS)) + chars + ["##" + c for c in string.ascii_lowercase]
    return {token: index for index, token in enumerate(dict.fromkeys(tokens))}


def save_tiny_bert(folder: str, *, max_positions: int = 128, matryoshka_dimensions=None,
                   lower_case: bool = True, seed: int = 0) -> str:
    """A 2-layer, hidden-32 BertModel with a WordPiece vocabulary written here; a plain HF folder."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    os.makedirs(folder, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab=_bert_vocab(), do_lower_case=lower_case)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=max_positions)
    if matryoshka_dimensions:
        config.matryoshka_dimensions = list(matryoshka_dimensions)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_float16_overflowing_bert(folder: str) -> str:
    """A tiny BERT folder (sentence-transformers, mean pooling) whose feed-forward layers reach ~1e5: fine in
    float32 (LayerNorm brings it back), inf and then NaN in float16, whose largest value is 65,504."""
    import torch
    from transformers import BertModel

    save_tiny_bert(folder)
    module = BertModel.from_pretrained(folder)
    with torch.no_grad():
        for layer in module.encoder.layer:
            layer.intermediate.dense.weight.mul_(1e6)
    module.save_pretrained(folder)
    return wrap_sentence_transformers(folder, "mean")


def save_tiny_classifier(folder: str, *, labels: tuple[str, ...] = ("score",), seed: int = 0) -> str:
    """A 2-layer BertForSequenceClassification (a cross-encoder with one label, a classifier with more)
    whose config names its labels (id2label); a plain HF folder with its tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    os.makedirs(folder, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab=_bert_vocab(), do_lower_case=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    config.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():  # a random head's logits sit near 0; spread them so that orderings mean something
        model.classifier.weight.mul_(20)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_tiny_colbert(folder: str, *, out_features: int = 16, seed: int = 0) -> str:
    """pylate's ColBERT layout: a BERT folder with sentence-transformers modules Transformer -> Dense (no
    Pooling, no bias, identity activation): the Dense projects every token state."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Transformer

    save_tiny_bert(folder, seed=seed)
    transformer = Transformer(folder)
    torch.manual_seed(seed + 1)
    dense = Dense(transformer.get_embedding_dimension(), out_features, bias=False,
                  activation_function=torch.nn.Identity())
    SentenceTransformer(modules=[transformer, dense], device="cpu").save(folder)
    return folder


def _byte_bpe_tokenizer(folder: str):
    """A byte-level BPE trained on the tiny corpus; appends <|endoftext|> like decoder embedders do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    eos = "<|endoftext|>"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[eos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(SEED_SENTENCES * 3 + sample_texts(50, seed=1), trainer=trainer)
    eos_id = bpe.token_to_id(eos)
    bpe.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, eos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, padding_side="left")


def save_tiny_decoder(folder: str, *, kind: str = "qwen2", seed: int = 0) -> str:
    """A 2-layer Qwen2 (or GPT2) with a byte-level BPE tokenizer that has NO pad token and pads left."""
    import torch
    from transformers import GPT2Config, GPT2Model, Qwen2Config, Qwen2Model

    os.makedirs(folder, exist_ok=True)
    tokenizer = _byte_bpe_tokenizer(folder)
    torch.manual_seed(seed)
    if kind == "qwen2":
        config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, eos_token_id=tokenizer.eos_token_id)
        config.architectures = ["Qwen2ForCausalLM"]
        model = Qwen2Model(config)
    else:
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=128,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
        config.architectures = ["GPT2LMHeadModel"]
        model = GPT2Model(config)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # transformers would load it as the model's tokenizer class, which invents a pad token; the generic
    # class keeps the "no pad token" case that decoder checkpoints often have.
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return folder


def wrap_sentence_transformers(folder: str, pooling: str | tuple[str, ...] = "mean", *, dense: bool = False,
                               normalize: bool = False, prompts: dict | None = None,
                               default_prompt_name: str | None = None, max_seq_length: int | None = None,
                               include_prompt: bool = True, do_lower_case: bool = False, seed: int = 0) -> str:
    """Add sentence-transformers modules to a HF folder in place (saved by ST itself, its current format)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformer = Transformer(folder, max_seq_length=max_seq_length)
    width = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(width, pooling_mode=pooling, include_prompt=include_prompt)]
    pooled = modules[-1].get_embedding_dimension()
    if dense:
        torch.manual_seed(seed + 1)
        modules.append(Dense(pooled, 24, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name,
                        device="cpu").save(folder)
    if do_lower_case:  # ST 6 no longer saves the flag; older folders carry it in sentence_bert_config.json
        path = os.path.join(folder, "sentence_bert_config.json")
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({**config, "do_lower_case": True}, handle)
    return folder


def st_reference(folder: str, *, drop_normalize: bool = False):
    """sentence-transformers loading the folder (optionally without its Normalize module) on CPU."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    model = SentenceTransformer(folder, device="cpu")
    if model.tokenizer.pad_token is None:  # ST pads through the tokenizer; the worker needs no pad token
        model.tokenizer.pad_token = model.tokenizer.eos_token
    if drop_normalize:
        model = SentenceTransformer(modules=[m for m in model if not isinstance(m, Normalize)], device="cpu",
                                    prompts=model.prompts, default_prompt_name=model.default_prompt_name)
    return model


# --- engine helpers: one Engine per folder for the whole session ---------------------------------------

@functools.cache
def engine_for(folder: str):
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.loader import load_model

    return Engine(load_model(folder))


def embed(folder: str, texts, **params):
    """Run one request through the folder's cached Engine; raises if it failed."""
    from embedfleet.common.request import EmbedRequest

    result = engine_for(folder).run([EmbedRequest(model="m", inputs=list(texts), params=params)])[0]
    result.raise_for_error()
    return result


def cosines(a, b):
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


# --- session fixtures: each flavour built once -------------------------------------------------------

def _bert_flavour(factory, name: str, pooling, **kwargs) -> str:
    folder = save_tiny_bert(str(factory.mktemp(name)), matryoshka_dimensions=kwargs.pop("matryoshka", None))
    return wrap_sentence_transformers(folder, pooling, **kwargs)


@pytest.fixture(scope="session")
def bert_cls(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_cls", "cls")


@pytest.fixture(scope="session")
def bert_mean(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_mean", "mean", max_seq_length=48)


@pytest.fixture(scope="session")
def bert_max(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_max", "max")


@pytest.fixture(scope="session")
def bert_weightedmean(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_wmean", "weightedmean")


@pytest.fixture(scope="session")
def bert_sqrt(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_sqrt", "mean_sqrt_len_tokens")


@pytest.fixture(scope="session")
def bert_lasttoken(tmp_path_factory) -> str:
    return _bert_flavour(tmp_path_factory, "bert_last", "lasttoken")


@pytest.fixture(scope="session")
def bert_dense_normalize(tmp_path_factory) -> str:
    """BERT -> mean pooling -> Dense(32->24, Tanh) -> Normalize."""
    return _bert_flavour(tmp_path_factory, "bert_dense", "mean", dense=True, normalize=True)


@pytest.fixture(scope="session")
def matryoshka_model(tmp_path_factory) -> str:
    """BERT with HF config matryoshka_dimensions [8, 16, 32], Normalize, and query/passage prompts."""
    return _bert_flavour(tmp_path_factory, "bert_matryoshka", "mean", normalize=True,
                         matryoshka=[8, 16, 32],
                         prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query")


@pytest.fixture(scope="session")
def decoder_lasttoken(tmp_path_factory) -> str:
    """Qwen2, last-token pooling, Normalize, left padding, tokenizer without a pad token."""
    folder = save_tiny_decoder(str(tmp_path_factory.mktemp("qwen2")))
    return wrap_sentence_transformers(folder, "lasttoken", normalize=True)


@pytest.fixture(scope="session")
def gpt2_lasttoken(tmp_path_factory) -> str:
    """GPT2 (absolute positions: left padding must not shift them), last-token pooling."""
    folder = save_tiny_decoder(str(tmp_path_factory.mktemp("gpt2")), kind="gpt2")
    return wrap_sentence_transformers(folder, "lasttoken", normalize=True)


@pytest.fixture(scope="session")
def cross_encoder(tmp_path_factory) -> str:
    """BertForSequenceClassification with one label: a cross-encoder (tasks score, classify)."""
    return save_tiny_classifier(str(tmp_path_factory.mktemp("cross_encoder")))


@pytest.fixture(scope="session")
def classifier(tmp_path_factory) -> str:
    """BertForSequenceClassification with three named labels."""
    return save_tiny_classifier(str(tmp_path_factory.mktemp("classifier")),
                                labels=("negative", "neutral", "positive"), seed=1)


@pytest.fixture(scope="session")
def colbert(tmp_path_factory) -> str:
    """A ColBERT-style folder: token vectors projected 32 -> 16 (tasks token_embed, score by MaxSim)."""
    return save_tiny_colbert(str(tmp_path_factory.mktemp("colbert")))
