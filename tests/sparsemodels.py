"""Tiny random bge-m3 and SPLADE folders for tests, built offline (no hub), in the layouts their references read:
FlagEmbedding's (an XLM-RoBERTa folder with sparse_linear.pt and colbert_linear.pt beside it, plus the
sentence-transformers files BAAI ships: CLS pooling, Normalize) and sentence-transformers' SparseEncoder
(MLMTransformer -> SpladePooling)."""

from __future__ import annotations

import os

from tests.tinymodels import SEED_SENTENCES, _bert_vocab, sample_texts, wrap_sentence_transformers

M3_COLBERT_DIM = 24


def _unigram_tokenizer():
    """An XLM-R style tokenizer (Unigram over Metaspace, <s> ... </s>, XLM-R's special ids 0-3) trained on the
    tiny corpus: what XLMRobertaTokenizerFast loads from a folder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaTokenizerFast

    unigram = Tokenizer(models.Unigram())
    unigram.normalizer = normalizers.NFKC()
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                      unk_token="<unk>")
    unigram.train_from_iterator(SEED_SENTENCES * 3 + sample_texts(80, seed=1), trainer=trainer)
    unigram.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return XLMRobertaTokenizerFast(tokenizer_object=unigram, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                   cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def save_tiny_m3(folder: str, *, seed: int = 0) -> str:
    """A 2-layer, hidden-32 XLMRobertaModel with random sparse (32 -> 1) and ColBERT (32 -> 24) heads saved as
    FlagEmbedding saves them (torch state dicts of nn.Linear), and bge-m3's sentence-transformers files."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    os.makedirs(folder, exist_ok=True)
    tokenizer = _unigram_tokenizer()
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2)
    torch.manual_seed(seed)
    XLMRobertaModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    sparse = torch.nn.Linear(32, 1)
    with torch.no_grad():  # a random head's weights would be ReLU'd to 0 for about half the tokens; keep most
        sparse.bias.fill_(0.2)
    torch.save(sparse.state_dict(), os.path.join(folder, "sparse_linear.pt"))
    torch.save(torch.nn.Linear(32, M3_COLBERT_DIM).state_dict(), os.path.join(folder, "colbert_linear.pt"))
    return wrap_sentence_transformers(folder, "cls", normalize=True)


def save_tiny_splade(folder: str, *, seed: int = 0, strategy: str = "max") -> str:
    """A 2-layer BertForMaskedLM saved as a sentence-transformers SparseEncoder (its fill-mask Transformer, then
    SpladePooling)."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    os.makedirs(folder, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab=_bert_vocab(), do_lower_case=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    config.architectures = ["BertForMaskedLM"]
    torch.manual_seed(seed)
    BertForMaskedLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pooling = SpladePooling(pooling_strategy=strategy, embedding_dimension=len(tokenizer))
    SparseEncoder(modules=[Transformer(folder, transformer_task="fill-mask"), pooling], device="cpu").save(folder)
    return folder
