"""Result._built (what the worker's Result.success and Result.failure use) gives the instance the dataclass's own
constructor gives: every field, every default, frozen, equal, hashable alike, and the same blob."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embedfleet.common.errors import InputTooLongError
from embedfleet.common.result import Result, Usage


def constructed(built: Result) -> Result:
    """The same result through the dataclass's __init__."""
    return Result(**{f.name: getattr(built, f.name) for f in dataclasses.fields(Result)})


def test_a_success_is_what_the_constructor_builds():
    built = Result.success("req-1", "m", np.arange(6, dtype=np.float32).reshape(2, 3), "float32", "big", 7)
    generic = constructed(built)
    assert built == generic and hash(built) == hash(generic) and vars(built) == vars(generic)
    assert built.usage == Usage(7) and built.endianness == "big" and built.shape == (2, 3)
    assert built.encode() == generic.encode() and Result.decode(built.encode()) == built
    np.testing.assert_array_equal(built.embeddings, np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.model = "other"


def test_a_failure_is_what_the_constructor_builds_with_every_default():
    built = Result.failure("req-2", "m", InputTooLongError("too long", param="input"))
    generic = constructed(built)
    assert built == generic and vars(built) == vars(generic)
    defaults = Result(id="req-2", model="m")
    assert (built.usage, built.task, built.parts, built.labels, built.sections, built.data) == \
        (defaults.usage, defaults.task, defaults.parts, defaults.labels, defaults.sections, defaults.data)
    assert built.status == "error" and built.error_param == "input" and not built.ok
    assert abs(built.finished_at - defaults.finished_at) < 60  # a fresh stamp, not the import's
    assert Result.decode(built.encode()) == built
