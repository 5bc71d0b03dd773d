"""The tiny task models' engines (one per folder and served name, loaded once per process) and the texts the task
tests send them: a query, documents to score against it, and texts to embed."""

from __future__ import annotations

import functools

from tests.tinymodels import sample_texts

QUERY = "weather in paris today"
DOCS = sample_texts(7, seed=3)
TEXTS = sample_texts(6, seed=4, max_words=40)


@functools.cache
def engine(folder: str, name: str):
    """A worker.engine.engine.Engine; a small token budget: one request's rows spread over several forward passes."""
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.loader import load_model

    return Engine(load_model(folder, served_name=name), max_batch_tokens=256, max_batch_size=4)
