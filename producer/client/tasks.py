"""What the sync and async producers share for the tasks beyond embed: pairing texts for score and ranking
scored documents for rerank (pure functions, no I/O)."""

from __future__ import annotations

from embedfleet.common.bounds import INT32_MAX, shown
from embedfleet.common.errors import ValidationError


def score_pairs(text_1, text_2) -> tuple[list[str], list[str]]:
    """vLLM's score pairing: one text against many (1:N), or two lists pairwise (N:N); as (firsts, seconds)."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    for name, texts in (("text_1", firsts), ("text_2", seconds)):
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValidationError(f"`{name}` must be a text or a non-empty list of texts", param=name)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(seconds) == 1:
        seconds = seconds * len(firsts)
    if len(firsts) != len(seconds):
        raise ValidationError(f"`text_1` has {len(firsts)} texts and `text_2` {len(seconds)}: send one text "
                              "against many, or two lists of the same length", param="text_2")
    return firsts, seconds


TOP_N_ALLOWED = f"0 (all) or a positive integer of at most {INT32_MAX}"


def check_rerank(query, documents, top_n: int | None) -> list[str]:
    if not isinstance(query, str):
        raise ValidationError("`query` must be a text", param="query")
    if not isinstance(documents, (list, tuple)) or not documents or \
            not all(isinstance(d, str) for d in documents):
        raise ValidationError("`documents` must be a non-empty list of texts", param="documents")
    if top_n is not None and not 0 <= top_n <= INT32_MAX:
        raise ValidationError(f"`top_n` must be {TOP_N_ALLOWED}, got {shown(top_n)}", param="top_n")
    return list(documents)


def rank(scores, documents: list[str], top_n: int | None = None, return_documents: bool = False) -> list[dict]:
    """Documents best first as {index, relevance_score[, document]}; top_n None or 0 keeps all (vLLM)."""
    # fewer scores than documents only for vLLM's truncate_prompt_tokens=0, which answers none
    order = sorted(range(min(len(documents), len(scores))), key=lambda i: -float(scores[i]))
    if top_n:
        order = order[:top_n]
    return [{"index": i, "relevance_score": float(scores[i]),
             **({"document": {"text": documents[i]}} if return_documents else {})} for i in order]
