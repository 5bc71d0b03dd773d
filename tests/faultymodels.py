"""Real loaded models with a fault injected into the forward pass, as a kernel bug or a small device would."""

from __future__ import annotations

import dataclasses

from embedfleet.worker.engine.models.base import LoadedModel


class FaultyModel(LoadedModel):
    """A real loaded model whose subclasses inject a fault into the forward pass."""

    @classmethod
    def of(cls, model: LoadedModel) -> FaultyModel:
        return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})


class PoisonedModel(FaultyModel):
    """Its forward pass raises whenever token POISON is in the batch, as a kernel bug on one input would."""

    POISON = 66

    def embed(self, token_lists, prompt_lengths=None):
        if any(self.POISON in ids for ids in token_lists):
            raise RuntimeError(f"token {self.POISON} crashes the kernel")
        return super().embed(token_lists, prompt_lengths)
