"""bge-m3 folders: an XLM-RoBERTa encoder with `sparse_linear.pt` and `colbert_linear.pt` beside it, whose one
forward pass gives three representations (FlagEmbedding's BGEM3FlagModel, read, not imported):

    dense    the CLS state (the folder's own pooling and Dense layers, as for any model), normalised in postprocess
    sparse   lexical weights: ReLU(sparse_linear(state)) per token, the max per distinct token id, the CLS, EOS,
             pad and unk ids dropped (FlagEmbedding's unused tokens), zero weights dropped
    colbert  colbert_linear(state) of every token but the first (the EOS kept, as FlagEmbedding keeps it),
             normalised per token in postprocess

`M3Model.outputs(token_lists, head)` runs the encoder once and computes the heads the pass's head names
(worker/engine/tasks/sparse.py); `embed` (the dense task alone) is LoadedModel's. The folder is first built
as any embedding folder (models/embedding.py), then the heads are added.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from embedfleet.worker.engine.models import embedding
from embedfleet.worker.engine.models.base import LoadedModel, LoadOptions, pad_batch
from embedfleet.worker.engine.models.stconfig import STConfig

M3_OUTPUTS = ("dense", "sparse", "colbert")
M3_TASKS = ("embed", "sparse_embed", "token_embed", "token_classify", "score", "tokenize", "detokenize")


def is_m3_folder(folder: str, transformer_path: str = "") -> bool:
    """bge-m3's `sparse_linear.pt` and `colbert_linear.pt` saved beside the encoder."""
    heads = ("sparse_linear.pt", "colbert_linear.pt")
    return any(all(os.path.isfile(os.path.join(folder, where, name)) for name in heads)
               for where in dict.fromkeys(("", transformer_path)))


def matches(folder: str, st: STConfig, hf_config) -> bool:
    return is_m3_folder(folder, st.transformer_path)


def load(folder: str, st: STConfig, hf_config, options: LoadOptions) -> M3Model:
    """The dense path as any embedding folder, the two heads added, then the dtype cast or CPU engine."""
    loaded = load_m3(embedding.build(folder, st, hf_config, options), os.path.join(folder, st.transformer_path))
    return embedding.ready_to_serve(loaded, st, hf_config, options)


def _linear(path: str) -> nn.Linear:
    """A Linear from a saved state dict (weight (out, in), bias (out,)): its sizes are read from the weight."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    out_features, in_features = state["weight"].shape
    layer = nn.Linear(in_features, out_features, bias="bias" in state)
    layer.load_state_dict(state)
    return layer.eval()


def max_per_id(ids: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One weight per distinct id, the largest, ids ascending (int32 ids, float32 weights)."""
    if not len(ids):
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    order = np.argsort(ids, kind="stable")
    ids, weights = ids[order], weights[order]
    distinct, starts = np.unique(ids, return_index=True)
    return distinct.astype(np.int32), np.maximum.reduceat(weights, starts).astype(np.float32)


@dataclass
class M3Model(LoadedModel):
    """A LoadedModel with bge-m3's two extra heads (float32: small, and the states are widened for them)."""

    sparse_linear: nn.Module | None = None
    colbert_linear: nn.Module | None = None
    unused_ids: tuple[int, ...] = ()  # dropped from the lexical weights
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @torch.inference_mode()
    def outputs(self, token_lists: list[list[int]], wanted: tuple[str, ...]) -> list[dict]:
        """One encoder pass; per row a dict of the `wanted` parts: "dense" (d,), "sparse" (ids, weights),
        "colbert" (tokens - 1, d), "lexical" (the per-token weights vLLM's token_classify gives, BOS and EOS
        left out: (tokens, 1)); float32 numpy, nothing normalised yet."""
        inputs = pad_batch(token_lists, self.pad_token_id, self.padding_side, self.device, self._position_ids)
        hidden = self.module(**inputs).last_hidden_state
        mask = inputs["attention_mask"].bool()
        rows: list[dict] = [{} for _ in token_lists]
        if "dense" in wanted:
            dense = self.dense(self.pooler(hidden, inputs["attention_mask"])).float().cpu().numpy()
            for row, vector in zip(rows, dense):
                row["dense"] = vector
        states = hidden.float()
        if "sparse" in wanted or "lexical" in wanted:
            weights = torch.relu(self.sparse_linear(states)).squeeze(-1).cpu().numpy()
            unused = np.asarray(self.unused_ids, np.int64)
            for index, (row, ids) in enumerate(zip(rows, token_lists)):
                real = weights[index][mask[index].cpu().numpy()]
                ids = np.asarray(ids, np.int64)
                if "sparse" in wanted:
                    keep = (real > 0) & ~np.isin(ids, unused)
                    row["sparse"] = max_per_id(ids[keep], real[keep])
                if "lexical" in wanted:
                    start = 1 if len(ids) and ids[0] == self.bos_token_id else 0
                    end = len(ids) - 1 if len(ids) > start and ids[-1] == self.eos_token_id else len(ids)
                    row["lexical"] = real[start:end].reshape(-1, 1).astype(np.float32)
        if "colbert" in wanted:
            colbert = self.colbert_linear(states).cpu()
            for index, row in enumerate(rows):
                real = colbert[index][mask[index].cpu()]
                row["colbert"] = real[1:].numpy()
        return rows


def load_m3(loaded: LoadedModel, transformer_dir: str) -> M3Model:
    """The model load_model built for the folder (the dense path), with the sparse and ColBERT heads added and
    the tasks and outputs they give advertised."""
    where = transformer_dir if os.path.isfile(os.path.join(transformer_dir, "sparse_linear.pt")) else loaded.folder
    sparse = _linear(os.path.join(where, "sparse_linear.pt")).to(loaded.device)
    colbert = _linear(os.path.join(where, "colbert_linear.pt")).to(loaded.device)
    tokenizer = loaded.tokenizer
    unused = tuple(dict.fromkeys(i for i in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                             tokenizer.unk_token_id) if i is not None))
    caps = loaded.caps.model_copy(update={"tasks": M3_TASKS, "outputs": M3_OUTPUTS,
                                          "token_size": colbert.out_features})
    fields = {name: getattr(loaded, name) for name in LoadedModel.__dataclass_fields__}
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    return M3Model(**{**fields, "caps": caps}, sparse_linear=sparse, colbert_linear=colbert, unused_ids=unused,
                   bos_token_id=bos, eos_token_id=eos)
