"""SPLADE folders (sentence-transformers' SparseEncoder layout: MLMTransformer -> SpladePooling): a masked-LM's
logits over the vocabulary at every token, through log(1 + ReLU(x)) (twice for `log1p_relu`), pooled over the
input's real tokens by max (or sum), as SpladePooling does. The answer is one sparse vector per input (task
sparse_embed); no dense vector exists, so `embed` is not served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.worker.engine.chat import chat_caps
from embedfleet.worker.engine.models.base import DTYPES, LoadOptions, load_transformer, max_len, pad_batch
from embedfleet.worker.engine.models.plaintext import MessageText, message_text
from embedfleet.worker.engine.models.stconfig import STConfig
from embedfleet.worker.engine.pooling import Pooler

SPLADE_TASKS = ("sparse_embed", "tokenize", "detokenize")


@dataclass
class SpladeModel:
    prepare = None  # tokenised by the engine (worker/engine/models/base.py Model); not a field
    tokenizer: object
    module: nn.Module  # an AutoModelForMaskedLM
    caps: ModelCapabilities
    device: torch.device
    strategy: str = "max"  # SpladePooling's pooling_strategy: max or sum
    twice: bool = False  # SpladePooling's activation log1p_relu: log1p applied a second time
    padding_side: str = "right"
    pad_token_id: int = 0
    fidelity: float = 1.0
    folder: str = ""
    pooler: Pooler = field(default_factory=lambda: Pooler(("max",)))  # preprocess asks it about prompts only
    _position_ids: bool = False
    plain_text: MessageText | None = None  # as LoadedModel's (worker/engine/models/plaintext.py)

    def prompt_length(self, prompt: str, add_special_tokens: bool) -> int:
        return 0  # SpladePooling pools every token, the prompt's included

    @torch.inference_mode()
    def outputs(self, token_lists: list[list[int]], wanted: tuple[str, ...]) -> list[dict]:
        """One forward pass; per row {"sparse": (ids, weights)}: the pooled vector's non-zero entries."""
        rows = []
        for pooled in self.embed(token_lists).numpy():
            ids = np.flatnonzero(pooled > 0)
            rows.append({"sparse": (ids.astype(np.int32), pooled[ids].astype(np.float32))})
        return rows

    @torch.inference_mode()
    def embed(self, token_lists: list[list[int]], prompt_lengths: list[int] | None = None) -> torch.Tensor:
        """One forward pass to the pooled vocabulary-wide vectors, float32 (n, vocab) on the CPU (what the start-up
        probe times; requests get `outputs`' sparse form)."""
        inputs = pad_batch(token_lists, self.pad_token_id, self.padding_side, self.device)
        logits = self.module(**inputs).logits
        mask = inputs["attention_mask"].bool()
        pooled = []
        for index in range(len(token_lists)):
            values = torch.log1p(torch.relu(logits[index][mask[index]].float()))  # (tokens, vocab), one row at a time
            if self.twice:
                values = torch.log1p(values)
            pooled.append(values.amax(dim=0) if self.strategy == "max" else values.sum(dim=0))
        return torch.stack(pooled).cpu()


def matches(folder: str, st: STConfig, hf_config) -> bool:
    return st.splade is not None


def load(folder: str, st: STConfig, config, options: LoadOptions) -> SpladeModel:
    return load_splade(folder, st, config, name=options.name, device=options.device, dtype=options.dtype,
                       max_inputs=options.max_inputs, trust_request_chat_template=options.trust_request_chat_template,
                       raw_text=options.raw_text)


def load_splade(folder: str, st: STConfig, config, *, name: str, device: torch.device, dtype: str,
                max_inputs: int, trust_request_chat_template: bool = False, raw_text: bool = False) -> SpladeModel:
    from transformers import AutoModelForMaskedLM  # noqa: PLC0415 - slow import, kept lazy

    tokenizer, module = load_transformer(folder, st, AutoModelForMaskedLM, device)
    if dtype != "float32":
        module.to(DTYPES[dtype])  # the logits are widened before the activation
    pooling = st.splade or {}
    strategy = pooling.get("pooling_strategy", "max")
    vocab = module.get_output_embeddings().out_features
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    caps = ModelCapabilities(
        name=name, max_model_len=max_len(st, tokenizer, config, module), embedding_size=vocab,
        vocab_size=module.get_input_embeddings().num_embeddings, pooling=f"splade-{strategy}",
        normalize=False, max_inputs=max_inputs, prompts=st.prompts, default_prompt_name=st.default_prompt_name,
        truncation_side=getattr(tokenizer, "truncation_side", "right") or "right",
        tasks=SPLADE_TASKS, outputs=("sparse",), **chat_caps(tokenizer, trust_request_chat_template))
    return SpladeModel(tokenizer=tokenizer, module=module, caps=caps, device=device,
                       strategy=strategy,
                       twice=pooling.get("activation_function", "relu") == "log1p_relu",
                       padding_side=getattr(tokenizer, "padding_side", "right") or "right", pad_token_id=pad,
                       folder=folder,
                       plain_text=None if raw_text else message_text(
                           folder, st.modality_config, st.processing_kwargs, tokenizer, config.model_type))
