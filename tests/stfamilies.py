"""One tiny random sentence-transformers folder per architecture family ST serves, saved by the installed
sentence-transformers (`SentenceTransformer(modules=[...]).save()`), for tests/parity/test_families.py.

Each builder writes a folder and returns its path. The tokenizers are trained here on the tiny corpus of
tests/tinymodels.py (no hub): WordPiece for the BERT-style encoders, byte-level BPE for RoBERTa / XLM-R and
the decoders, a BPE with T5's specials for T5. The chat folders get their template BEFORE ST saves them, so
ST 6 writes `modality_config` with a `message` entry (plain strings are rendered through the template).
"""

from __future__ import annotations

import json
import os

from tests.tinymodels import (SEED_SENTENCES, _bert_vocab, _byte_bpe_tokenizer, sample_texts, save_tiny_bert,
                              save_tiny_decoder, wrap_sentence_transformers)

# Templates as chat models ship them: specials written by the template (so the rendered text is tokenised
# without added ones), a tail after the content that truncation must not lose.
FLAT_TEMPLATE = ("[CLS] {% for m in messages %}{{ m.role }} : {{ m.content }} {% endfor %}[SEP]")
STRUCTURED_TEMPLATE = ("[CLS] {% for m in messages %}{{ m.role }} : "
                       "{{ m.content[0].text }} {% endfor %}[SEP]")
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "<|endoftext|>")


def _save_tokenizer(tokenizer, folder: str) -> None:
    """Saved with the generic fast class named, so AutoTokenizer loads exactly this tokenizer."""
    tokenizer.save_pretrained(folder)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle)


def _wordpiece():
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab=_bert_vocab(), do_lower_case=True, model_max_length=128)


def _bpe(specials: list[str], single: str, **names):
    """A byte-level BPE with `specials` first (ids 0, 1, ...) and `single` as the post-processor template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(SEED_SENTENCES * 3 + sample_texts(50, seed=1), trainer=trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(t, bpe.token_to_id(t)) for t in specials if t in single])
    # as shipped tokenizers say: the position table's length less RoBERTa's offset
    return PreTrainedTokenizerFast(tokenizer_object=bpe, model_max_length=128, **names)


def _roberta_tokenizer():
    return _bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s> $A </s>", bos_token="<s>", eos_token="</s>",
                pad_token="<pad>", unk_token="<unk>", cls_token="<s>", sep_token="</s>", mask_token="<mask>")


def _save_encoder(folder: str, model, tokenizer) -> str:
    import torch

    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model.eval().save_pretrained(folder)
    _save_tokenizer(tokenizer, folder)
    return folder


def save_family(kind: str, folder: str) -> str:
    """A plain HF folder of one family (tiny random weights), before sentence-transformers wraps it."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    small = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "hidden_size": 32}
    if kind in ("roberta", "xlmr"):
        tokenizer = _roberta_tokenizer()
        config_class, model_class = (tf.RobertaConfig, tf.RobertaModel) if kind == "roberta" \
            else (tf.XLMRobertaConfig, tf.XLMRobertaModel)
        config = config_class(vocab_size=len(tokenizer), max_position_embeddings=130, pad_token_id=1,
                              bos_token_id=0, eos_token_id=2, **small)
        return _save_encoder(folder, model_class(config), tokenizer)
    if kind == "distilbert":
        tokenizer = _wordpiece()
        config = tf.DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                     max_position_embeddings=128, pad_token_id=0)
        return _save_encoder(folder, tf.DistilBertModel(config), tokenizer)
    if kind == "mpnet":
        tokenizer = _wordpiece()
        config = tf.MPNetConfig(vocab_size=len(tokenizer), max_position_embeddings=130, pad_token_id=0, **small)
        return _save_encoder(folder, tf.MPNetModel(config), tokenizer)
    if kind == "modernbert":
        tokenizer = _wordpiece()
        config = tf.ModernBertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, pad_token_id=0,
                                     cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
                                     global_attn_every_n_layers=2, local_attention=16, **small)
        return _save_encoder(folder, tf.ModernBertModel(config), tokenizer)
    if kind == "qwen3":
        tokenizer = _byte_bpe_tokenizer(folder)
        config = tf.Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                max_position_embeddings=128, eos_token_id=tokenizer.eos_token_id)
        config.architectures = ["Qwen3ForCausalLM"]
        return _save_encoder(folder, tf.Qwen3Model(config), tokenizer)
    if kind in ("t5_encoder", "t5_full"):
        tokenizer = _bpe(["<pad>", "</s>", "<unk>"], "$A </s>", eos_token="</s>", pad_token="<pad>",
                         unk_token="<unk>")
        config = tf.T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                             pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        # sentence-T5 / GTR ship the encoder alone (architectures T5EncoderModel, model_type t5); a full
        # checkpoint carries the decoder too, which sentence-transformers leaves out.
        model = tf.T5EncoderModel(config) if kind == "t5_encoder" else tf.T5Model(config)
        return _save_encoder(folder, model, tokenizer)
    if kind in ("gpt2", "qwen2"):
        return save_tiny_decoder(folder, kind=kind)
    if kind == "bert":
        return save_tiny_bert(folder)
    raise ValueError(f"unknown family {kind!r}")


def with_template(folder: str, template: str) -> str:
    """The folder's tokenizer given a chat template (before ST saves: ST then writes a `message` modality)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return folder


# family name -> (base architecture, ST pooling, wrap options, chat template or None)
FAMILIES: dict[str, tuple] = {
    "bert_mean": ("bert", "mean", {}, None),
    "bert_cls_dense": ("bert", "cls", {"dense": True, "normalize": True}, None),
    "bert_max": ("bert", "max", {}, None),
    "bert_weightedmean": ("bert", "weightedmean", {}, None),
    "bert_mean_sqrt_len": ("bert", "mean_sqrt_len_tokens", {}, None),
    "bert_cls_mean": ("bert", ("cls", "mean"), {}, None),
    "roberta": ("roberta", "mean", {"normalize": True}, None),
    "xlmr": ("xlmr", "cls", {}, None),
    "distilbert": ("distilbert", "mean", {}, None),
    "mpnet": ("mpnet", "mean", {"normalize": True}, None),
    "modernbert": ("modernbert", "mean", {}, None),
    "gpt2_last": ("gpt2", "lasttoken", {"normalize": True}, None),
    "qwen2_last": ("qwen2", "lasttoken", {"normalize": True}, None),
    "qwen3_last": ("qwen3", "lasttoken", {"normalize": True}, None),
    "t5_encoder": ("t5_encoder", "mean", {"dense": True, "normalize": True, "max_seq_length": 64}, None),
    "t5_full": ("t5_full", "mean", {"max_seq_length": 64}, None),
    "chat_bert_flat": ("bert", "mean", {"max_seq_length": 48}, FLAT_TEMPLATE),
    "chat_bert_structured": ("bert", "cls", {"prompts": {"query": "find: "}}, STRUCTURED_TEMPLATE),
    "chat_qwen3_last": ("qwen3", "lasttoken", {"normalize": True, "max_seq_length": 48, "default_prompt_name": "query",
                                                "prompts": {"query": "Instruct: find the passage\nQuery: "}},
                        QWEN_TEMPLATE),
}


def build(name: str, folder: str) -> str:
    """FAMILIES[name] built in `folder` and saved by sentence-transformers."""
    base, pooling, options, template = FAMILIES[name]
    save_family(base, folder)
    if template:
        with_template(folder, template)
    return wrap_sentence_transformers(folder, pooling, **options)
