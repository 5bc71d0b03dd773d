"""Every list a gateway request body holds stops its validation at its first bad item (common/bounds.py's
FailFastList, issue 49): a list of a million wrong items is one error, not a million built on the event loop."""

from __future__ import annotations

import importlib
import pkgutil
import time

import pytest
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

import embedfleet.producer.gateway as gateway
from embedfleet.common.errors import invalid_request
from embedfleet.producer.gateway.tasks.schemas import ScoreBody, TeiDecodeBody


def gateway_models() -> list[type[BaseModel]]:
    """Every pydantic model the gateway's modules define (its request bodies and their parts), new ones included."""
    for module in pkgutil.walk_packages(gateway.__path__, f"{gateway.__name__}."):
        if not module.name.endswith("__main__"):  # it runs the gateway
            importlib.import_module(module.name)
    found, todo = set(), [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith(f"{gateway.__name__}.") and not sub.__module__.endswith(".settings"):
                found.add(sub)
    return sorted(found, key=lambda model: f"{model.__module__}.{model.__qualname__}")


def sequences(schema, where: str = ""):
    """(where, fail_fast) of every list, set and variadic tuple in a pydantic core schema. JsonValue's own lists
    are left out: they take any JSON value, so they never fail (dicts are bounded by --max-body-keys)."""
    if isinstance(schema, dict):
        if str(schema.get("ref", schema.get("schema_ref", ""))).startswith("pydantic.types.JsonValue"):
            return
        kind = schema.get("type")
        if kind in ("list", "set", "frozenset") or (kind == "tuple" and schema.get("variadic_item_index") is not None):
            yield where, schema.get("fail_fast")
        for key, value in schema.items():
            if key not in ("metadata", "serialization"):
                yield from sequences(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            yield from sequences(value, f"{where}[{index}]")


def test_every_list_of_every_gateway_body_is_fail_fast():
    models = gateway_models()
    assert {"EmbedBody", "ScoreBody", "CohereEmbedBody", "TeiSimilarityBody", "Message"} <= {m.__name__ for m in models}
    lists = {f"{model.__qualname__}{where}": fail_fast for model in models
             for where, fail_fast in sequences(model.__pydantic_core_schema__)}
    assert len(lists) > 10, lists  # the walk finds them
    assert not {where for where, fail_fast in lists.items() if not fail_fast}


@pytest.mark.parametrize("model, body, says", [
    (ScoreBody, {"text_1": "a", "text_2": ["ok"] * 10 + [1] * 1_000_000}, "text_2.list[str].10: Input should be"),
    (TeiDecodeBody, {"ids": [[1, 2], ["x"] * 1_000_000]}, "ids.list[list[int]].1.0: Input should be a valid integer"),
])
def test_a_union_of_lists_gives_one_error_per_member(model, body, says):
    """A union tries each member: each stops at its own first bad item."""
    began = time.monotonic()
    with pytest.raises(PydanticValidationError) as caught:
        model.model_validate(body)
    assert len(caught.value.errors()) == 2
    assert says in invalid_request(caught.value.errors()).message
    assert time.monotonic() - began < 5  # milliseconds alone, seconds before; bound generous for a loaded machine
