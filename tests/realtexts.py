"""Real English texts of varied length, for comparing the fleet's vectors with a reference: the bench corpus's
docstrings (bench/corpus.py)."""

from __future__ import annotations

from bench.corpus import stdlib_docstrings


def corpus_texts() -> list[str]:
    """60 texts of varied length (real English: the bench corpus's docstrings, spread over its lengths), some far
    beyond the model's 256 tokens."""
    texts = sorted(stdlib_docstrings(), key=len)
    picked = texts[:: len(texts) // 54][:54]
    long = " ".join(picked[-5:] * 20)
    return picked + [long, long[: len(long) // 2], "a", "short text", "another short one",
                     " ".join(["many words"] * 400)]
