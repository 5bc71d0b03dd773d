"""Sequence-classification models (cross-encoders, classifiers): loading and the forward pass to logits.

A ClassifierModel is a Model (worker/engine/models/base.py) with LoadedModel's `tokenizer`, `module`, `device` and
`token_embed`, so the engine batches it by the same token budget; its `embed` answers one row of logits per
input (a text, or a pair tokenised as one row: the budget counts both sides), its `token_embed` one row of
logits per token (task token_classify).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.chat import chat_caps
from embedfleet.worker.engine.models.base import DTYPES, LoadOptions, activation, load_transformer, max_len, pad_batch
from embedfleet.worker.engine.models.stconfig import STConfig

log = logging.getLogger(__name__)


@dataclass
class ClassifierModel:
    prepare = None  # tokenised by the engine (worker/engine/models/base.py Model); not a field
    tokenizer: object
    module: nn.Module
    caps: ModelCapabilities
    device: torch.device
    score_activation: nn.Module  # what sentence-transformers' CrossEncoder.predict applies to the logits
    padding_side: str = "right"
    pad_token_id: int = 0
    token_types: bool = True  # BERT-style segment ids for the second text of a pair
    fidelity: float = 1.0

    @torch.inference_mode()
    def embed(self, token_lists: list[list[int]], prompt_lengths: list[int] | None = None,
              pair_starts: list[int] | None = None) -> torch.Tensor:
        """One forward pass: float32 logits (n, num_labels) on the CPU. `pair_starts[i]`, when not 0, is where
        row i's second text starts (its segment ids are 1 from there, as the tokenizer gives a pair)."""
        inputs = pad_batch(token_lists, self.pad_token_id, self.padding_side, self.device)
        if self.token_types:
            types = torch.zeros_like(inputs["input_ids"])
            for row, start in enumerate(pair_starts or ()):
                if start:
                    offset = types.shape[1] - len(token_lists[row]) if self.padding_side == "left" else 0
                    types[row, offset + start:offset + len(token_lists[row])] = 1
            inputs["token_type_ids"] = types
        return self.module(**inputs).logits.float().cpu()

    @torch.inference_mode()
    def token_embed(self, token_lists: list[list[int]]) -> list:
        """The engine's per-token pass (head "tokens"), here for task token_classify: the classifier applied to
        every real token's last hidden state, as vLLM's token_classify pools a sequence classifier (all
        tokens, no CLS pooler, no activation here), float32 (tokens, labels) numpy arrays."""
        inputs = pad_batch(token_lists, self.pad_token_id, self.padding_side, self.device)
        if self.token_types:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        base = getattr(self.module, self.module.base_model_prefix)
        hidden = base(**inputs).last_hidden_state
        logits = self.module.classifier(hidden).float().cpu()
        mask = inputs["attention_mask"].bool().cpu()
        return [logits[row][mask[row]].numpy() for row in range(len(token_lists))]


def _score_activation(folder: str, config, num_labels: int) -> nn.Module:
    """CrossEncoder's activation: the folder's `activation_fn` (sentence-transformers 6, 4-5 or older
    layouts), only torch.nn classes as ST allows without trust_remote_code; else Sigmoid for one label."""
    path = None
    st_file = os.path.join(folder, "config_sentence_transformers.json")
    if os.path.isfile(st_file):
        with open(st_file, encoding="utf-8") as handle:
            path = json.load(handle).get("activation_fn")
    saved = getattr(config, "sentence_transformers", None)
    if path is None and isinstance(saved, dict):
        path = saved.get("activation_fn")
    path = path or getattr(config, "sbert_ce_default_activation_function", None)
    if path:
        return activation(path) if path.startswith("torch.") else nn.Sigmoid() if num_labels == 1 \
            else nn.Identity()
    return nn.Sigmoid() if num_labels == 1 else nn.Identity()


def _per_token_head(module: nn.Module) -> bool:
    """True when the classification head is one linear layer over the hidden states (BERT's), which scores a
    single token as well as the pooled sequence: token_classify is served only then. A head that pools inside
    (RoBERTa's takes the first token itself) or adds layers of its own has no per-token meaning."""
    prefix = getattr(module, "base_model_prefix", "")
    head = getattr(module, "classifier", None)
    # nothing else between the encoder and the layer (DistilBERT's pre_classifier would be skipped)
    only = {name for name, _ in module.named_children()} <= {prefix, "dropout", "classifier"}
    return only and isinstance(head, nn.Linear) and getattr(module, prefix, None) is not None \
        and head.in_features == module.config.hidden_size


def is_classifier(config) -> bool:
    """A sequence-classification checkpoint (a cross-encoder, a classifier): served for score/classify."""
    return any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])


def matches(folder: str, st: STConfig, hf_config) -> bool:
    """A classifier checkpoint with no sentence-transformers pooling or Dense of its own."""
    return is_classifier(hf_config) and st.pooling is None and not st.dense_paths


def load(folder: str, st: STConfig, config, options: LoadOptions) -> ClassifierModel:
    if (st.modality_config or {}).get("message") is not None and not options.raw_text:
        # sentence-transformers 6 renders such a folder's (query, document) pairs through the chat template,
        # which this loader's pair tokenising does not do: refused rather than scored otherwise
        raise StartupError(f"model folder {folder}: a cross-encoder or classifier whose modality_config renders "
                           "its inputs as chat messages is not served exactly; serve it with --raw-text for "
                           "vLLM's raw pairs")
    return load_classifier(folder, st, config, name=options.name, device=options.device, dtype=options.dtype,
                           max_inputs=options.max_inputs,
                           trust_request_chat_template=options.trust_request_chat_template)


def load_classifier(folder: str, st: STConfig, config, *, name: str, device: torch.device, dtype: str,
                    max_inputs: int, trust_request_chat_template: bool = False) -> ClassifierModel:
    """A cross-encoder (num_labels 1: tasks score and classify) or a classifier (classify)."""
    from transformers import AutoModelForSequenceClassification  # noqa: PLC0415

    tokenizer, module = load_transformer(folder, st, AutoModelForSequenceClassification, device)
    num_labels = int(config.num_labels)
    id2label = getattr(config, "id2label", None) or {}
    labels = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(num_labels))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    caps = ModelCapabilities(
        name=name, max_model_len=max_len(st, tokenizer, config, module),
        embedding_size=num_labels, vocab_size=module.get_input_embeddings().num_embeddings,
        pooling="classifier", normalize=True, max_inputs=max_inputs,
        truncation_side=getattr(tokenizer, "truncation_side", "right") or "right",
        tasks=(("score", "classify") if num_labels == 1 else ("classify",))
        + (("token_classify",) if _per_token_head(module) else ()) + ("tokenize", "detokenize"),
        labels=labels, **chat_caps(tokenizer, trust_request_chat_template))
    model = ClassifierModel(
        tokenizer=tokenizer, module=module, caps=caps, device=device,
        score_activation=_score_activation(folder, config, num_labels),
        padding_side=getattr(tokenizer, "padding_side", "right") or "right", pad_token_id=pad,
        token_types="token_type_ids" in tokenizer.model_input_names and getattr(config, "type_vocab_size", 2) > 1)
    if dtype != "float32":
        module.to(DTYPES[dtype])  # logits have no cosine to check; the cast is what vLLM serves too
        log.info("classifier %s serves in %s", name, dtype)
    return model
