"""Pooling strategies (sentence-transformers' six modes), chosen by name from the model's pooling config.

Every strategy takes the token states `hidden` (batch, seq, dim), the `mask` of tokens to pool (padding
and, with include_prompt=False, prompt tokens zeroed) and the `attention` mask of real tokens, and returns
float32 (batch, dim). Padding may sit on either side; nothing padded ever reaches a result, so a text
pools the same alone or in a mixed-length batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Strategy = Callable[[Tensor, Tensor, Tensor], Tensor]

# sentence-transformers' legacy boolean keys, in the order it concatenates several modes.
LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def _first_index(mask: Tensor) -> Tensor:
    return mask.to(torch.int32).argmax(dim=1)


def _gather(hidden: Tensor, index: Tensor) -> Tensor:
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, index].float()


def cls(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    """The first pooled token (the [CLS] token, found past any left padding)."""
    return _gather(hidden, _first_index(mask))


def lasttoken(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    """The last pooled token (past any right padding); decoder embedders read it."""
    seq_len = mask.shape[1]
    values, from_end = mask.flip(1).max(dim=1)
    index = torch.where(values == 0, seq_len - 1, seq_len - 1 - from_end)
    return _gather(hidden, index) * values.unsqueeze(-1).float()


def _masked_sum(hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    weights = mask.unsqueeze(-1).float()
    return (hidden.float() * weights).sum(dim=1), weights.sum(dim=1).clamp(min=1e-9)


def mean(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    total, count = _masked_sum(hidden, mask)
    return total / count


def mean_sqrt_len_tokens(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    total, count = _masked_sum(hidden, mask)
    return total / count.sqrt()


def max_tokens(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    return hidden.float().masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values


def weightedmean(hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
    """Position-weighted mean; weights count from the first real token (so left padding shifts nothing)."""
    positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=torch.float32)
    weights = positions.unsqueeze(0) - _first_index(attention).unsqueeze(1).float()
    weights = (weights * mask.float()).unsqueeze(-1)
    return (hidden.float() * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


STRATEGIES: dict[str, Strategy] = {
    "cls": cls,
    "max": max_tokens,
    "mean": mean,
    "mean_sqrt_len_tokens": mean_sqrt_len_tokens,
    "weightedmean": weightedmean,
    "lasttoken": lasttoken,
}


def modes_from_config(config: dict) -> tuple[str, ...]:
    """The pooling mode(s) named by a sentence-transformers `1_Pooling/config.json` (new or legacy keys)."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(name for key, name in LEGACY_KEYS.items() if config.get(key))
        modes = modes or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    unknown = [m for m in modes if m not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown pooling mode {unknown[0]!r}: known are {sorted(STRATEGIES)}")
    return modes


class Pooler:
    """One or more strategies; several modes are concatenated in config order, as sentence-transformers does."""

    def __init__(self, modes: Sequence[str], include_prompt: bool = True):
        unknown = [m for m in modes if m not in STRATEGIES]
        if unknown:
            raise ValueError(f"unknown pooling mode {unknown[0]!r}: known are {sorted(STRATEGIES)}")
        self.modes = tuple(modes)
        self.include_prompt = include_prompt
        self._strategies = [STRATEGIES[m] for m in self.modes]

    @property
    def name(self) -> str:
        return "+".join(self.modes)

    def __call__(self, hidden: Tensor, attention: Tensor, prompt_lengths: Tensor | None = None) -> Tensor:
        """Pool `hidden` over `attention`; `prompt_lengths` (per row) are skipped when include_prompt is off."""
        mask = attention
        if not self.include_prompt and prompt_lengths is not None:
            mask = exclude_prompt(attention, prompt_lengths)
        return self.pool(hidden, mask, attention)

    def pool(self, hidden: Tensor, mask: Tensor, attention: Tensor) -> Tensor:
        """Pool the tokens `mask` marks (late chunking: one span's), among the real tokens of `attention`."""
        pooled = [strategy(hidden, mask, attention) for strategy in self._strategies]
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)


def exclude_prompt(attention: Tensor, prompt_lengths: Tensor) -> Tensor:
    """Zero the first `prompt_lengths[i]` real tokens of each row (sentence-transformers' include_prompt=False)."""
    positions = torch.arange(attention.shape[1], device=attention.device).unsqueeze(0)
    start = _first_index(attention).unsqueeze(1)
    keep = positions >= start + prompt_lengths.to(attention.device).unsqueeze(1)
    return attention * keep.to(attention.dtype)
