"""A changed copy of a frozen pydantic model, without pydantic's generic copying.

`model.model_copy(update=changes)` deep-walks nothing but still costs ~5 us of generic Python (copy.copy of
each private slot, a fields-set update); the request path makes one for every request it verifies (the
params merged with the model's defaults, the request carrying them). For the frozen, extra="forbid" models
of common/ (no extras, no private attributes) this builds the same object directly: the same `__dict__`, the
same fields set; the values are not validated, as model_copy does not validate them either
(tests/unit/test_wire_params.py compares the two).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

Model = TypeVar("Model", bound=BaseModel)


def updated(model: Model, **changes) -> Model:
    """`model.model_copy(update=changes)` for a frozen model without extras or private attributes."""
    copied = object.__new__(type(model))
    object.__setattr__(copied, "__dict__", {**model.__dict__, **changes})
    object.__setattr__(copied, "__pydantic_fields_set__", model.__pydantic_fields_set__ | changes.keys())
    object.__setattr__(copied, "__pydantic_extra__", None)  # extra="forbid": never any
    object.__setattr__(copied, "__pydantic_private__", None)  # no private attributes
    return copied
