"""Producer and AsyncProducer offer one surface (issue 50): the same public methods, with the same signatures and
docstrings, written once (producer/client/surface.py); AsyncProducer's are coroutines exactly where they do I/O.
The differences are intended ones, listed here and in docs/python.md. Every method that submits takes every
request field (`**fields`) and hands each one on to the request, in both clients. No Redis: the shared methods run
on clients whose hooks only record what they were handed."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from embedfleet import AsyncProducer, Producer
from embedfleet.producer.client.surface import Surface

DOCS = Path(__file__).resolve().parents[2] / "docs" / "python.md"

# name -> why only one client has it (docs/python.md, "Producer and AsyncProducer", says the same)
INTENDED = {
    "as_completed": "AsyncProducer only: many waits in flight, consumed as their results land",
    "results": "AsyncProducer only: every result of this producer as it lands, from its reply stream",
}
SYNC_ONLY_ARGUMENTS = {"__init__": {"connection"}}  # Producer(connection=): a ready redis.Redis (the tests')
PROTOCOLS = {Producer: {"__enter__", "__exit__"}, AsyncProducer: {"__aenter__", "__aexit__"}}  # `with` / `async with`

SUBMITTING = ["submit", "submit_many", "embed", "encode", "score", "rerank", "classify", "token_embed", "sparse_embed",
              "tokenize", "detokenize"]
FIRST_ARGUMENTS = {"inputs", "batches", "text_1", "query", "token_ids"}  # what a submitting method sends


def public(cls) -> dict:
    return {name: member for name in dir(cls) if not name.startswith("_")
            and callable(member := getattr(cls, name))}


def shared_names() -> list[str]:
    return sorted(set(public(Producer)) & set(public(AsyncProducer)))


def test_both_clients_have_the_same_public_methods_but_the_intended_differences():
    sync, aio = set(public(Producer)), set(public(AsyncProducer))
    assert sync ^ aio == set(INTENDED), "a method one client lacks: add it to the other, or to INTENDED and the docs"
    assert set(INTENDED) <= aio  # (each of them is AsyncProducer's)
    for cls, methods in PROTOCOLS.items():
        assert all(name in vars(cls) for name in methods)


def test_every_shared_method_is_declared_once_with_its_docstring():
    for name in shared_names():
        declared = vars(Surface).get(name)
        assert declared is not None, f"{name}: not in surface.py, the one definition"
        assert declared.__doc__, f"{name}: no docstring"
        assert inspect.getdoc(getattr(Producer, name)) == inspect.getdoc(getattr(AsyncProducer, name)) \
            == inspect.getdoc(declared), name


@pytest.mark.parametrize("name", shared_names())
def test_the_same_signature_in_both_clients(name):
    """Parameters (names, kinds, defaults, annotations) and the return annotation, as surface.py declares them."""
    declared = inspect.signature(vars(Surface)[name])
    assert inspect.signature(getattr(Producer, name)) == declared
    assert inspect.signature(getattr(AsyncProducer, name)) == declared


def test_the_constructors_differ_only_by_the_intended_arguments():
    sync, aio = (inspect.signature(cls.__init__).parameters for cls in (Producer, AsyncProducer))
    assert set(sync) - set(aio) == SYNC_ONLY_ARGUMENTS["__init__"] and set(aio) <= set(sync)
    assert all(sync[name] == aio[name] for name in aio)


@pytest.mark.parametrize("name", shared_names())
def test_async_methods_are_coroutines_exactly_where_they_do_io(name):
    does_io = getattr(vars(Surface)[name], "does_io", False)
    assert inspect.iscoroutinefunction(getattr(AsyncProducer, name)) == does_io
    assert not inspect.iscoroutinefunction(getattr(Producer, name))


def attributes(client) -> set[str]:
    return {name for name in dir(client) if not name.startswith("_") and not callable(getattr(client, name))}


def test_both_clients_hold_the_same_public_attributes():
    async def of_async() -> set[str]:
        producer = AsyncProducer("redis://127.0.0.1:1/0")  # (nothing connects before a command)
        try:
            return attributes(producer)
        finally:
            await producer.close()

    producer = Producer("redis://127.0.0.1:1/0")
    sync = attributes(producer)
    producer.close()
    assert sync == asyncio.run(of_async()) >= {"redis_url", "redis", "shards", "links", "where", "max_queue_depth"}


def test_docs_python_md_lists_the_intended_differences():
    text = DOCS.read_text()
    section = text[text.index("## Producer and AsyncProducer"):]
    section = section[:section.index("\n## ", 1)]
    for name in [*INTENDED, *SYNC_ONLY_ARGUMENTS["__init__"]]:
        assert f"`{name}" in section, f"docs/python.md does not say why only one client has {name}"


def test_every_submitting_method_takes_every_field():
    for cls in (Producer, AsyncProducer):
        for name in SUBMITTING:
            fields = inspect.signature(getattr(cls, name)).parameters.get("fields")
            assert fields is not None and fields.kind is inspect.Parameter.VAR_KEYWORD, f"{cls.__name__}.{name}"
    sends = {name for name in shared_names() if FIRST_ARGUMENTS & set(inspect.signature(getattr(Producer, name))
                                                                     .parameters)}
    assert sends == set(SUBMITTING), "a new method that submits: add it to SUBMITTING"


# -- the shared definitions, run on hooks that record what they are handed ----------------------------------

FIELDS = {"priority": "bulk", "deadline": 4e9, "dimensions": 2, "embed_dtype": "float16", "truncate_prompt_tokens": -1,
          "cache": False}
CALLS = {  # method -> its arguments besides the fields
    "submit": (["a"], "m"), "submit_many": ([["a"]], "m"), "embed": (["a"], "m"), "encode": (["a"], "m"),
    "score": ("q", ["a", "b"], "m"), "rerank": ("q", ["a", "b"], "m"), "classify": (["a"], "m"),
    "token_embed": (["a"], "m"), "sparse_embed": (["a"], "m"), "tokenize": (["a"], "m"), "detokenize": ([[1, 2]], "m")}
ANSWER = SimpleNamespace(embeddings=np.zeros((1, 2)), scores=np.array([0.25, 0.75]), multi_vectors=[], sparse=[],
                         items=[])


def _unused(*args, **kwargs):
    """(No I/O here.)"""
    raise AssertionError("a hook these tests do not use")


class SyncRecorder(Surface):
    """surface.py's methods on Producer's `_then` and hooks that record each submit instead of sending it."""

    _read = _read_adverts = _result_at = _results_at = _cancel_at = _exists = close = check = wait = _unused
    _then = staticmethod(Producer._then)

    def __init__(self):
        self.sent: list[tuple[str, dict]] = []

    def _ask(self, timeout, inputs, model=None, **submit):
        self.sent.append(("submit", submit))
        return ANSWER

    def submit_many(self, batches, model=None, **keywords):
        self.sent.append(("submit_many", keywords))
        return ["an-id"] * len(batches)


class AsyncRecorder(SyncRecorder, awaits=True):
    """The same on AsyncProducer's `_then`: each shared method a coroutine."""

    _then = staticmethod(AsyncProducer._then)

    async def _ask(self, timeout, inputs, model=None, **submit):
        return SyncRecorder._ask(self, timeout, inputs, model, **submit)

    async def submit_many(self, batches, model=None, **keywords):
        return SyncRecorder.submit_many(self, batches, model, **keywords)


@pytest.mark.parametrize("recorder", [SyncRecorder, AsyncRecorder])
@pytest.mark.parametrize("name", SUBMITTING)
def test_every_submitting_method_hands_on_every_field(name, recorder):
    client = recorder()
    own_id = {"request_ids": ["mine-1"]} if name == "submit_many" else {"request_id": "mine-1"}
    answer = getattr(client, name)(*CALLS[name], **FIELDS, **own_id)
    if recorder is AsyncRecorder:
        assert inspect.iscoroutine(answer)
        answer = asyncio.run(answer)
    (sent,) = client.sent
    if name == "submit":  # (submit is submit_many of one request)
        own_id = {"request_ids": ["mine-1"]}
    assert sent == ("submit_many" if name in ("submit", "submit_many") else "submit", {**sent[1], **FIELDS, **own_id})
    assert answer is not None
