"""--engine openvino: the transformer's forward in OpenVINO (CPU), from a shipped export, or converted from
the ONNX export (worker/engine/backends/onnx.py's, cached) once; --quantize int8 through NNCF."""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.backends import cache, export
from embedfleet.worker.engine.backends.calibration import calibration_digest

log = logging.getLogger(__name__)

SHIPPED = os.path.join("openvino", "openvino_model.xml")  # sentence-transformers' / optimum-intel's layout
MODEL = "openvino_model.xml"


class OpenVinoBackend:
    """The OpenVINO twin of OnnxBackend: same inputs, same output."""

    engine = "openvino"

    def __init__(self, path: str, threads: int, quantize: str | None = None, source: str = ""):
        import openvino as ov  # noqa: PLC0415 - the [openvino] extra

        core = ov.Core()
        # f32: OpenVINO would otherwise run bf16 on CPUs with AMX/AVX512-BF16, below the float32 gate.
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        self.compiled = core.compile_model(core.read_model(path), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.path, self.quantize, self.source = path, quantize, source
        self.inputs = [port.get_any_name() for port in self.compiled.inputs]
        unknown = set(self.inputs) - {"input_ids", "attention_mask", "token_type_ids", "position_ids"}
        if unknown or "input_ids" not in self.inputs:
            raise StartupError(f"the OpenVINO model {path} takes inputs {sorted(self.inputs)}; the openvino engine "
                               "feeds input_ids, attention_mask, token_type_ids and position_ids only: serve the "
                               "model with --engine torch, or remove the export so that one is made from the weights")
        names = [port.get_any_name() for port in self.compiled.outputs]
        self.output = names.index("last_hidden_state") if "last_hidden_state" in names else 0

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.request.infer(_feed(self.inputs, inputs))
        return torch.from_numpy(np.array(self.request.get_output_tensor(self.output).data, np.float32))

    def describe(self) -> str:
        return f"openvino{' int8' if self.quantize else ''} ({self.source})"


def _feed(names: list[str], inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """pad_batch's torch inputs as the model's named int64 arrays (token types zero, positions counted)."""
    ids = inputs["input_ids"].cpu().numpy().astype(np.int64)
    feed = {}
    for name in names:
        if name == "input_ids":
            feed[name] = ids
        elif name == "attention_mask":
            feed[name] = inputs["attention_mask"].cpu().numpy().astype(np.int64)
        elif name == "token_type_ids":
            feed[name] = np.zeros_like(ids)
        elif "position_ids" in inputs:  # left padding: positions count from each text's first token
            feed[name] = inputs["position_ids"].cpu().numpy().astype(np.int64)
        else:
            feed[name] = np.ascontiguousarray(np.broadcast_to(np.arange(ids.shape[1]), ids.shape))
    return feed


def _save(model, out: str) -> None:
    import openvino as ov  # noqa: PLC0415 - the [openvino] extra

    ov.save_model(model, os.path.join(out, MODEL), compress_to_fp16=False)  # float32 weights: the fp32 gate


SCHEMES = ("all", "keep-ffn-down")  # as worker/engine/backends/export.py's, most int8 first


def _ffn_down(model) -> list[str]:
    """Weight MatMuls fed by an elementwise product (GELU's last step, SwiGLU's gate): the FFN's down
    projections, whose outliers per-tensor int8 flattens."""
    found = []
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        source, weight = op.input_value(0).get_node(), op.input_value(1).get_node()
        if source.get_type_name() == "Multiply" and weight.get_type_name() in ("Constant", "Convert"):
            found.append(op.get_friendly_name())
    return found


def _quantize(model, out: str, calibration: list[dict[str, torch.Tensor]], scheme: str) -> None:
    """NNCF's post-training int8 (weights and activations; SmoothQuant for transformers; asymmetric
    activations) calibrated on worker/engine/backends/calibration.py's texts."""
    # NNCF reports usage over the network unless told it runs in CI; a worker never calls out.
    os.environ.setdefault("NNCF_CI", "1")
    try:
        import nncf  # noqa: PLC0415 - optional: only --engine openvino --quantize int8 needs it
    except ImportError as exc:
        raise StartupError("--engine openvino --quantize int8 needs NNCF: pip install 'embedfleet[openvino]'") from exc
    names = [port.get_any_name() for port in model.inputs]
    samples = nncf.Dataset([_feed(names, inputs) for inputs in calibration])
    ignored = nncf.IgnoredScope(names=_ffn_down(model)) if scheme == "keep-ffn-down" else None
    quantized = nncf.quantize(model, samples, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration),
                              preset=nncf.QuantizationPreset.MIXED, ignored_scope=ignored)
    _save(quantized, out)


def load(model_dir: str, onnx_export, *, quantize: str | None, files_digest: str, root: str, threads: int,
         calibration, scheme: str = "all") -> OpenVinoBackend:
    """The folder's shipped OpenVINO model, or one read from an ONNX export (the folder's shipped one, else
    `onnx_export()`'s, worker/engine/backends/onnx.py) and cached; int8 quantised from either.
    `calibration()` gives NNCF's sample inputs (pad_batch's)."""
    import openvino as ov  # noqa: PLC0415 - the [openvino] extra

    shipped = os.path.join(model_dir, SHIPPED)
    if os.path.isfile(shipped) and not quantize:
        return OpenVinoBackend(shipped, threads, None, f"shipped {SHIPPED}")
    versions = {**export.versions(), "openvino": ov.__version__, "calibration": calibration_digest()}

    def build(out: str) -> None:
        # Core.read_model reads ONNX itself (ov.convert_model would do the same and report telemetry).
        model = ov.Core().read_model(source())
        if quantize:
            _quantize(model, out, calibration(), scheme)
        else:
            _save(model, out)

    def source() -> str:
        if os.path.isfile(shipped):
            return shipped
        onnx_shipped = os.path.join(model_dir, "onnx", "model.onnx")
        return onnx_shipped if os.path.isfile(onnx_shipped) else os.path.join(onnx_export(), "raw.onnx")

    engine = ("openvino-shipped" if os.path.isfile(shipped) else "openvino") + (f"-{scheme}" if quantize else "")
    folder = cache.cached(root, cache.export_key(files_digest, engine, quantize, versions), build, MODEL)
    return OpenVinoBackend(os.path.join(folder, MODEL), threads, quantize,
                           f"export{f' int8 ({scheme})' if quantize else ''} in {folder}")
