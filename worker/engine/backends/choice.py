"""The engine a worker serves with (EngineChoice: --engine and its companions) and the fidelity gates. A leaf: what
names a choice (models/base.py's LoadOptions) imports it, and none of the backends' code."""

from __future__ import annotations

from dataclasses import dataclass

# The lowest probe cosine against float32 torch that an engine may serve at: an unquantised export
# computes the same function (only the order of float sums differs); int8 is an approximation.
GATES = {None: 0.99999, "int8": 0.99}


@dataclass(frozen=True)
class EngineChoice:
    """--engine, --quantize, --fidelity-gate and --engine-cache-dir, as load_model takes them."""

    engine: str = "torch"
    quantize: str | None = None
    gate: float | None = None  # None: GATES[quantize]
    cache_dir: str | None = None  # None: worker/engine/backends/cache.py default_root()
    threads: int | None = None  # the engine's intra-op threads (worker/engine/cpus.py); None: the affinity's CPUs
    spinning: bool = False  # waiting threads may spin (OMP_WAIT_POLICY=ACTIVE): ONNX Runtime's allow_spinning

    @property
    def label(self) -> str:
        """The engine as adverts, logs and the vector cache's model identity name it: torch, onnx, onnx-int8."""
        return self.engine + (f"-{self.quantize}" if self.quantize else "")

    @property
    def min_cosine(self) -> float:
        return self.gate if self.gate is not None else GATES[self.quantize]

    @property
    def on_cpu(self) -> bool:
        return self.engine != "torch"
