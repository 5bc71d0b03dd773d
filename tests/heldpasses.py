"""Forward passes a test can hold, to act while the device is busy: `GatedEngine` holds every round inside its
forward step until released, `Recorded` (a model) records each pass's token ids and holds the passes it is told."""

from __future__ import annotations

import threading


class GatedEngine:
    """The real engine, held inside its forward step until the test lets it go, to observe a busy worker.
    Without a forward-pass shape: its rounds are cut by request count (max_jobs) alone."""

    shaper = None

    def shape(self):
        return None

    def __init__(self, engine):
        self.engine, self.caps, self.model = engine, engine.caps, engine.model  # the model keys the vector cache
        self.prepare, self.finish, self.combine_parts = engine.prepare, engine.finish, engine.combine_parts
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, work, between=None, **known):
        self.entered.set()
        assert self.release.wait(20)
        return self.engine.forward(work, between, **known)


class Recorded:
    """The real model, recording each forward pass's token ids; the passes numbered in `gates` wait for their
    event, so that the test can act while the device is busy."""

    def __init__(self, model, gates: dict[int, threading.Event]):
        self._model, self.gates = model, gates
        self.passes: list[list[list[int]]] = []
        self.waiting = {number: threading.Event() for number in gates}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def embed(self, token_lists, prompt_lengths=None, **pairs):
        self.passes.append([list(ids) for ids in token_lists])
        number = len(self.passes) - 1
        if number in self.gates:
            self.waiting[number].set()
            assert self.gates[number].wait(60), f"the test never let pass {number} go"
        return self._model.embed(token_lists, prompt_lengths, **pairs)
