"""Padding-free forward: a batch runs as ONE unpadded sequence of all its tokens (vLLM's and TEI's packing).

A padded batch computes every row to the longest row's length; on a GPU with short, mixed-length texts most
of that work is padding. Packed, the rows are concatenated into a (1, total tokens) sequence, each text's
positions count from its own start, and attention is kept inside each text by its cumulative lengths
(`cu_seqlens`): on CUDA in float16/bfloat16 one call of PyTorch's varlen FlashAttention
(`torch.nn.attention.varlen.varlen_attn`), elsewhere (CPU, float32: the reference, and what the tests run)
scaled-dot-product attention per text, which is exact and slow.

It hooks into transformers 5's attention interface: `AttentionInterface` gets a function of our own
(`embedfleet_packed`) that does the above when a call carries `cu_seq_lens_q` and is plain SDPA otherwise,
so the padded path (token_embed, the fidelity check's reference) keeps working on the same module; the mask
interface gets SDPA's mask builder, except that a packed call (no 2D mask) builds none (transformers would
otherwise build a block-diagonal total x total mask from the position ids). Models whose layers pass
`**kwargs` to the attention interface and take `position_ids` (BERT, RoBERTa, Qwen2, Llama, ...) are
candidates; whether a model is served packed is decided at start-up by the fidelity gate below, never by a
list of names: a model that ignored the packing would mix texts and fail it.
"""

from __future__ import annotations

import inspect
import logging
from itertools import chain
from typing import Literal

import numpy as np
import torch
from torch.nn import functional as F

from embedfleet.worker.engine.fidelity import probe_token_lists

log = logging.getLogger(__name__)

PackedMode = Literal["auto", "on", "off"]
ATTENTION = "embedfleet_packed"
MIN_COSINE = 0.99999  # packing must not change a vector: rounding only
_HALF = (torch.float16, torch.bfloat16)


def _varlen_kernel(query: torch.Tensor) -> bool:
    """PyTorch's varlen FlashAttention runs on CUDA, in half precision only."""
    return query.is_cuda and query.dtype in _HALF


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs):
    """The attention of `embedfleet_packed`: packed when the call carries cu_seqlens, else transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415 - lazy

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: key/value heads shared by query heads
    # (1, heads, tokens, head_dim) -> (tokens, heads, head_dim), the layout of varlen kernels
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if _varlen_kernel(query):
        from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - CUDA only

        longest = int(kwargs["max_length_q"])
        out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling, enable_gqa=groups > 1,
                          **({"window_size": (-1, 0)} if causal else {}))
    else:
        out = torch.empty_like(q)
        bounds = cu.tolist()
        for start, end in zip(bounds, bounds[1:]):  # per text: exact, for the CPU and float32
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), k[start:end].transpose(0, 1), v[start:end].transpose(0, 1),
                is_causal=causal, scale=scaling, enable_gqa=groups > 1).transpose(0, 1)
    return out.unsqueeze(0), None  # (1, tokens, heads, head_dim), as transformers' attention functions return


def _mask(*args, attention_mask=None, **kwargs):
    """SDPA's mask for a padded call; none for a packed one (its attention keeps texts apart by cu_seqlens)."""
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415 - lazy

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface  # noqa: PLC0415 - lazy
    from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, _mask)


class Packer:
    """Runs a LoadedModel's transformer on a batch packed into one sequence; returns what the padded path
    gives its pooler: hidden states (rows, longest, hidden) padded on the model's side, and the mask."""

    def __init__(self, position_offset: int = 0, replaced: str = "sdpa"):
        self.position_offset = position_offset  # RoBERTa's positions start after its padding index
        self.replaced = replaced  # the attention implementation the model ran before (`unpack` restores it)

    def __call__(self, model, token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        device = model.device
        lengths = torch.tensor([len(ids) for ids in token_lists], dtype=torch.long)
        flat = torch.from_numpy(np.fromiter(chain.from_iterable(token_lists), np.int64, int(lengths.sum())))
        starts = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(len(flat)) - torch.repeat_interleave(starts, lengths) + self.position_offset
        cu = torch.zeros(len(token_lists) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0)
        longest = int(lengths.max())
        cu = cu.to(device)
        out = model.module(input_ids=flat.unsqueeze(0).to(device), position_ids=positions.unsqueeze(0).to(device),
                           cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        hidden = out.last_hidden_state[0]
        lengths = lengths.to(device)
        columns = torch.arange(longest, device=device)
        mask = columns >= (longest - lengths)[:, None] if model.padding_side == "left" \
            else columns < lengths[:, None]
        # Row-major order of the mask's True cells is the packed order of the tokens, on either side.
        padded = hidden.new_zeros((len(token_lists), longest, hidden.shape[-1]))
        padded[mask] = hidden
        return padded, mask.long()


def _position_offset(module) -> int | None:
    """Where a text's positions start: 0, RoBERTa's padding index + 1, or None (positions not settable)."""
    if "position_ids" not in inspect.signature(module.forward).parameters:
        return None
    embeddings = getattr(module, "embeddings", None)
    if embeddings is not None and hasattr(embeddings, "create_position_ids_from_input_ids"):
        return int(embeddings.padding_idx) + 1
    return 0


def choose(model, mode: PackedMode, dtype: torch.dtype = torch.float32) -> str:
    """Serve `model` (a LoadedModel on torch, still in float32) packed where `mode` asks for it and the probe
    texts agree with the padded path; `dtype` is what it will serve in. Returns a one-line reason, also logged.

    auto: packed on CUDA in half precision (where the varlen kernel runs and padding costs), else padded;
    on: packed wherever the gate passes (the CPU runs it exactly but without gain: tests, benches);
    off: padded. The gate runs here, in float32, packed against padded (MIN_COSINE: rounding only); a model
    later cast to half precision then meets the dtype's own check on the packed path (embedding.ready_to_serve), and
    `unpack` serves it padded if the packed path alone fails there.
    """
    if mode == "off":
        return _say(model, "padded (--packed off)")
    if mode == "auto" and not (model.device.type == "cuda" and dtype in _HALF):
        return _say(model, f"padded (--packed auto packs on CUDA in float16/bfloat16; this is "
                           f"{model.device.type} {str(dtype).removeprefix('torch.')})")
    if model.backend is not None:
        return _say(model, f"padded: --packed needs the torch engine, not {model.engine}")
    offset = _position_offset(model.module)
    if offset is None:
        return _say(model, f"padded: {type(model.module).__name__} takes no position_ids, so it cannot be packed")
    previous = model.module.config._attn_implementation
    if previous not in ("sdpa", "eager", ATTENTION):
        return _say(model, f"padded: the model runs {previous} attention, which packing would replace")
    _register()
    ids = probe_token_lists(model)
    reference = model.embed(ids)
    model.packer = Packer(offset, previous)
    try:
        model.module.set_attn_implementation(ATTENTION)
        cosine = torch.nn.functional.cosine_similarity(reference, model.embed(ids)).min().item()
    except Exception as exc:  # noqa: BLE001 - any failure of an architecture we cannot pack means: stay padded
        cosine, failure = 0.0, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        failure = f"probe cosine {cosine:.6f}"
    if not cosine >= MIN_COSINE:  # NaN (an overflow) fails too
        return unpack(model, f"packed forward disagrees with padded ({failure}; the gate is {MIN_COSINE})")
    kernel = "varlen FlashAttention" if model.device.type == "cuda" and dtype in _HALF else "SDPA per text"
    return _say(model, f"packed ({kernel}; probe cosine vs padded in float32 {cosine:.6f})")


def unpack(model, why: str) -> str:
    """Serve `model` padded again (its attention as before `choose`), saying why once, as a warning."""
    model.module.set_attn_implementation(model.packer.replaced)
    model.packer = None
    return _say(model, f"padded: {why}", logging.WARNING)


def _say(model, line: str, level: int = logging.INFO) -> str:
    log.log(level, "model %s forward: %s", model.caps.name, line)
    model.forward_layout = line.split(" ", 1)[0].rstrip(":")
    return line
