"""The start-up probe: which forward-pass shape (padded-token budget, row cap) serves this model fastest on
this device. Small batches win on a CPU (per text), large ones on a GPU; measuring beats guessing.

For a few sequence lengths it times passes of 1, 2, 4, ... rows of synthetic tokens, stopping a length once
texts/s has clearly peaked or the time is spent, then scores every (budget, cap) pair the measurements
suggest; a pair's cost is the time to embed one text of each probed length at the rates measured (a batch
of a length gets min(cap, budget // length) rows). The cheapest pair wins; between equals the smaller (lower
latency). Bounded by `seconds`; logged.

Whatever it measured, the shape is never below the device's floor (`device_floor`, TEI's max_batch_tokens
idea): a probe run while neighbours hold the cores sees small passes win by noise or starvation and would
otherwise serve 1-row passes for life. The probe (and the learner, worker/engine/shaper.py) may raise the
shape above the floor, never lower it under; a flag is the user's and stays as given.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

TOLERANCE = 1e-6  # relative cost within which two shapes count as equally fast (then the smaller wins)
# The floor: (padded tokens, rows) per pass a round fills when it has the inputs. On a CPU 16 short rows cost
# about 3x one row's time for 16x its texts (MiniLM, bench/history.md §14), so the floor costs an
# interactive request little and a starved probe's 1-row guess much; a GPU's is TEI's default budget.
CPU_FLOOR = (2048, 16)
GPU_FLOOR = (16384, 64)


@dataclass(frozen=True)
class Budget:
    """What the batcher uses, and where it came from."""

    max_batch_tokens: int
    max_batch_size: int
    source: str  # "probe", "flags", or "probe+flags"
    texts_per_s: dict[int, float] = field(default_factory=dict)  # best measured per length (probe only)

    def describe(self, packed: bool = False) -> str:
        """The shape for a log line. Packed passes have no padding: their budget bounds the real tokens."""
        rates = ", ".join(f"{length} tok: {rate:.0f}/s" for length, rate in sorted(self.texts_per_s.items()))
        return (f"{self.max_batch_tokens} {'tokens' if packed else 'padded tokens'}, {self.max_batch_size} rows "
                f"({self.source}{'; best texts/s ' + rates if rates else ''})")


def _lengths(max_len: int) -> list[int]:
    """Short, medium and the model's longest (capped: longer inputs are rare and slow to probe)."""
    longest = min(max_len, 512)
    return sorted({min(16, longest), min(64, longest), longest})


def _timed(embed, token_lists: list[list[int]], min_seconds: float) -> float:
    """Seconds per pass: one warm-up, then the fastest of up to 5 passes (at least `min_seconds` in all, or
    5): on a shared machine the minimum is the least disturbed measurement."""
    embed(token_lists)
    fastest, spent = float("inf"), 0.0
    for _ in range(5):
        start = time.perf_counter()
        embed(token_lists)
        took = time.perf_counter() - start
        fastest, spent = min(fastest, took), spent + took
        if spent >= min_seconds:
            break
    return fastest


def measure(embed, token_id: int, lengths: list[int], seconds: float, max_rows: int,
            max_tokens: int) -> dict[int, dict[int, float]]:
    """texts/s for each (length, rows) tried: {length: {rows: rate}}."""
    deadline = time.monotonic() + seconds
    share = seconds / len(lengths)
    rates: dict[int, dict[int, float]] = {}
    for index, length in enumerate(lengths):
        stop = min(deadline, time.monotonic() + share * (1 + index))  # unused time passes on
        curve = rates.setdefault(length, {})
        rows, worse = 1, 0
        while rows <= max_rows and rows * length <= max_tokens and time.monotonic() < stop:
            per_pass = _timed(embed, [[token_id] * length] * rows, min(0.05, share / 20))
            curve[rows] = rows / per_pass
            best = max(curve.values())
            worse = worse + 1 if curve[rows] < 0.97 * best else 0
            if worse >= 2 or time.monotonic() + 3 * per_pass > stop:
                break  # past the peak, or the next (twice as long) pass would overrun
            rows *= 2
    return rates


def choose(rates: dict[int, dict[int, float]], max_tokens: int | None = None,
           max_rows: int | None = None) -> tuple[int, int]:
    """The (budget, cap) with the least time for one text of each probed length (the smaller between
    equals); a fixed value (a flag) stays fixed."""
    def rate(curve: dict[int, float], rows: int) -> float:
        tried = [r for r in curve if r <= rows]
        return curve[max(tried)] if tried else 0.0

    budgets = [max_tokens] if max_tokens else sorted({r * length for length, curve in rates.items() for r in curve})
    caps = [max_rows] if max_rows else sorted({r for curve in rates.values() for r in curve})
    scored = []
    for budget in budgets:
        for cap in caps:
            # seconds to embed one text of each probed length: long texts weigh most, as in real traffic
            cost = sum(1.0 / max(rate(curve, min(cap, max(1, budget // length))), 1e-9)
                       for length, curve in rates.items() if curve)
            scored.append((cost, budget, cap))
    # The fastest; between equals, the smaller shape (lower latency, less padding on real texts).
    fastest = min(s[0] for s in scored)
    pick = min((s[1], s[2]) for s in scored if s[0] <= fastest * (1 + TOLERANCE))
    return pick


def floored(budget: int, cap: int, floor: tuple[int, int], max_tokens: int | None = None,
             max_rows: int | None = None) -> tuple[int, int]:
    """(budget, cap) raised to the floor; a dimension a flag fixed stays as the flag has it."""
    return (max_tokens or max(budget, floor[0]), max_rows or max(cap, floor[1]))


def probe_budget(model, *, seconds: float = 5.0, max_tokens: int | None = None, max_rows: int | None = None,
                 limit_tokens: int = 131072, limit_rows: int = 1024, floor: tuple[int, int] = (1, 1)) -> Budget:
    """Probe `model` (a LoadedModel) unless both flags are given; flags win over the probe, the floor
    (`device_floor`) over what the probe measured."""
    if max_tokens and max_rows:
        return Budget(max_tokens, max_rows, "flags")
    token_id = _ordinary_token(model)
    lengths = _lengths(model.caps.max_model_len)
    began = time.monotonic()
    rates = measure(lambda ids: model.embed(ids), token_id, lengths, seconds,
                    max_rows or limit_rows, max_tokens or limit_tokens)
    measured = choose(rates, max_tokens, max_rows)
    budget, cap = floored(*measured, floor, max_tokens, max_rows)
    source = "probe+flags" if (max_tokens or max_rows) else "probe"
    if (budget, cap) != measured:
        source += f", floor {floor[0]} tok / {floor[1]} rows"
    budget = max(budget, max(lengths))  # a batch of one longest input must always fit
    result = Budget(budget, cap, source,
                    {length: max(curve.values()) for length, curve in rates.items() if curve})
    log.info("batch budget probe (%.1f s): %s; texts/s by rows: %s", time.monotonic() - began,
             result.describe(getattr(model, "forward_layout", "padded") == "packed"),
             {length: {r: round(v) for r, v in curve.items()} for length, curve in rates.items()})
    return result


def _ordinary_token(model) -> int:
    """A token id that is no special token (values do not change the cost, but keep the pass honest)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return 0
    ids = tokenizer("embedding probe", add_special_tokens=False)["input_ids"]
    return ids[0] if ids else max(0, min(1000, model.caps.vocab_size - 1))



def device_floor(model, limits: tuple[int, int]) -> tuple[int, int]:
    """The least (padded tokens, rows) per pass this device runs when a round has the inputs (see above),
    within the device's `limits` (device_limits) and at least one pass of the model's longest input."""
    device = getattr(model, "device", None)
    tokens, rows = GPU_FLOOR if getattr(device, "type", str(device)) == "cuda" else CPU_FLOOR
    return max(min(tokens, limits[0]), min(model.caps.max_model_len, limits[0])), min(rows, limits[1])


def device_limits(model) -> tuple[int, int]:
    """The largest (padded tokens, rows) per pass worth trying on the model's device: on a GPU, what about a
    fifth of its free memory holds in activations (hidden size x layers x 4 bytes x ~16 live tensors per
    token: a rough bound, generous for inference); on a CPU, a fixed bound (more only costs latency there)."""
    device = getattr(model, "device", None)
    if getattr(device, "type", str(device)) == "cuda":
        import torch  # noqa: PLC0415 - only a GPU worker asks

        free, _ = torch.cuda.mem_get_info(device)
        config = model.module.config
        hidden = getattr(config, "hidden_size", 1024)
        layers = getattr(config, "num_hidden_layers", 24)
        per_token = hidden * layers * 4 * 16
        return max(model.caps.max_model_len, min(1 << 20, free // 5 // per_token)), 4096
    return 65536, 1024
