"""--engine onnx: the transformer's forward in ONNX Runtime (CPU), from a shipped or a cached export."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import torch

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.backends import cache, export

log = logging.getLogger(__name__)

SHIPPED = os.path.join("onnx", "model.onnx")  # where sentence-transformers / optimum put a folder's export
_NUMPY = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class OnnxBackend:
    """Runs an ONNX graph that maps (input_ids, attention_mask[, token_type_ids, position_ids]) to the last
    hidden state; called with pad_batch's torch inputs, returns a float32 CPU tensor (batch, length, hidden)."""

    engine = "onnx"

    def __init__(self, path: str, threads: int, quantize: str | None = None, source: str = "",
                 spinning: bool = False):
        import onnxruntime as ort  # noqa: PLC0415 - the [onnx] extra

        options = ort.SessionOptions()
        # One pass at a time per worker: all its threads inside the operators, none between them.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Threads that spin while they wait hold a shared core from its neighbours (worker/engine/cpus.py).
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # its warnings about unused initialisers are noise in a worker's log
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.path, self.quantize, self.source = path, quantize, source
        self.inputs = {i.name: _NUMPY.get(i.type, np.int64) for i in self.session.get_inputs()}
        unknown = set(self.inputs) - {"input_ids", "attention_mask", "token_type_ids", "position_ids"}
        if unknown or "input_ids" not in self.inputs:
            raise StartupError(f"the ONNX export {path} takes inputs {sorted(self.inputs)}; the onnx engine feeds "
                               "input_ids, attention_mask, token_type_ids and position_ids only: serve the model "
                               "with --engine torch, or remove the export so that one is made from the weights")
        outputs = [o.name for o in self.session.get_outputs()]
        self.output = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = inputs["input_ids"].cpu().numpy()
        mask = inputs["attention_mask"].cpu().numpy()
        feed = {}
        for name, kind in self.inputs.items():
            if name == "input_ids":
                value = ids
            elif name == "attention_mask":
                value = mask
            elif name == "token_type_ids":
                value = np.zeros_like(ids)
            elif "position_ids" in inputs:  # left padding: positions count from each text's first token
                value = inputs["position_ids"].cpu().numpy()
            else:
                value = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
            feed[name] = np.ascontiguousarray(value, dtype=kind)
        return torch.from_numpy(self.session.run([self.output], feed)[0]).float()

    def describe(self) -> str:
        return f"onnxruntime{' int8' if self.quantize else ''} ({self.source})"


def export_folder(model_dir: str, hf_config, *, files_digest: str, root: str, left_padding: bool) -> str:
    """Our export of the folder, made once: raw.onnx (as torch exported it: what float32 ONNX Runtime runs and
    OpenVINO converts) and model.onnx (fused by onnxruntime's optimizer where it knows the model type, else the
    same graph: what int8 quantises)."""
    def build(out: str) -> None:
        raw = os.path.join(out, "raw.onnx")
        log.info("exporting %s to ONNX (once: cached under %s)", model_dir, root)
        export.export_onnx(model_dir, raw, left_padding)
        text = hf_config.get_text_config()
        if not export.fuse(raw, os.path.join(out, "model.onnx"), hf_config.model_type,
                           getattr(text, "num_attention_heads", 0), getattr(text, "hidden_size", 0)):
            shutil.copyfile(raw, os.path.join(out, "model.onnx"))

    return cache.cached(root, cache.export_key(files_digest, "onnx", None, export.versions()), build, "model.onnx")


SCHEMES = export.SCHEMES


def load(model_dir: str, hf_config, *, quantize: str | None, files_digest: str, root: str, threads: int,
         left_padding: bool, scheme: str = "all", spinning: bool = False) -> OnnxBackend:
    """The folder's shipped export (onnx/model.onnx) or ours from the cache; --quantize int8 quantises
    either once per scheme (export.SCHEMES), into a cache folder of its own."""
    shipped = os.path.join(model_dir, SHIPPED)
    if os.path.isfile(shipped):
        source, what = shipped, f"shipped {SHIPPED}"
    else:
        folder = export_folder(model_dir, hf_config, files_digest=files_digest, root=root, left_padding=left_padding)
        source, what = os.path.join(folder, "model.onnx"), f"export in {folder}"
        if not quantize:
            # float32 runs the unfused graph: measured here (MiniLM, 2 AVX-512 cores) the session's own
            # fusions beat the optimizer's (1.08x vs 0.92x torch on 32 short texts); int8 quantises the fused
            # graph, whose single Attention operator is what its "attention" layout quantises.
            return OnnxBackend(os.path.join(folder, "raw.onnx"), threads, None, what, spinning)
    if not quantize:
        return OnnxBackend(source, threads, None, what, spinning)
    engine = f"onnx{'-shipped' if source == shipped else ''}-{scheme}"
    folder = cache.cached(root, cache.export_key(files_digest, engine, quantize, export.versions()),
                          lambda out: export.quantize_int8(source, os.path.join(out, "model_int8.onnx"), scheme),
                          "model_int8.onnx")
    return OnnxBackend(os.path.join(folder, "model_int8.onnx"), threads, quantize,
                       f"{what}, int8 ({scheme}) in {folder}", spinning)
