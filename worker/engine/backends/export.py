"""Exporting a model folder's transformer to ONNX from the local files (no hub), and fusing it.

The export covers the transformer only: its last hidden state is what every task reads. Tokeniser,
pooling, Dense, normalisation and Matryoshka stay in worker/engine (shared by all engines), so an export
never has to know them and one export serves every task.
"""

from __future__ import annotations

import logging
import warnings

import torch

from embedfleet.worker.engine.models.base import feature_class

log = logging.getLogger(__name__)

OPSET = 17
# onnxruntime's transformer optimizer knows these encoders' attention and layer-norm patterns (its "bert"
# fusions cover the BERT family); other models run with the session's own graph optimisations only.
_FUSABLE = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "camembert": "bert", "electra": "bert",
            "distilbert": "bert", "mpnet": "bert"}


class _LastHidden(torch.nn.Module):
    """The transformer with positional inputs and one output, as the exporter wants it."""

    def __init__(self, module: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.module, self.names = module, names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.module(**dict(zip(self.names, tensors))).last_hidden_state


def input_names(module: torch.nn.Module, left_padding: bool) -> tuple[str, ...]:
    """input_ids and attention_mask; position_ids too for a left-padded model that takes them (left padding
    must not shift positions, worker/engine/models/base.py pad_batch). BERT's token_type_ids stay at their zeros."""
    import inspect  # noqa: PLC0415 - only here

    names = ("input_ids", "attention_mask")
    if left_padding and "position_ids" in inspect.signature(module.forward).parameters:
        names += ("position_ids",)
    return names


def export_onnx(model_dir: str, path: str, left_padding: bool) -> None:
    """Write `model_dir`'s transformer (float32, eager attention) as ONNX with dynamic batch and length."""
    from transformers import AutoConfig  # noqa: PLC0415 - slow import, kept lazy

    # Eager attention: the exporter traces plain matmuls that onnxruntime's optimizer can fuse again,
    # where SDPA would leave a graph of masks built per call. The class is the one torch serves (T5: the
    # encoder alone, as sentence-transformers loads it).
    module = feature_class(AutoConfig.from_pretrained(model_dir)).from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    names = input_names(module, left_padding)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 0, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    example = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    axes = {name: {0: "batch", 1: "sequence"} for name in (*names, "last_hidden_state")}
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter (still the one that emits the plain graphs onnxruntime's optimizer fuses)
        # warns about its own deprecation and about trace-time constants that hold for every padded batch.
        warnings.simplefilter("ignore")
        torch.onnx.export(_LastHidden(module, names), tuple(example[n] for n in names), path,
                          input_names=list(names), output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


def fuse(path: str, out: str, model_type: str, heads: int, hidden: int) -> bool:
    """onnxruntime's transformer optimizer (attention, layer norm, GELU fused into single kernels) where
    it knows the model type; False (nothing written) where it does not."""
    kind = _FUSABLE.get(model_type)
    if kind is None:
        return False
    try:
        from onnxruntime.transformers.optimizer import optimize_model  # noqa: PLC0415 - the [onnx] extra
    except ImportError:  # an [openvino]-only install: OpenVINO reads the raw export
        return False

    # opt_level 0: only the Python fusions, so the file stays portable across CPUs (the session applies
    # its hardware-specific optimisations when it loads).
    optimized = optimize_model(path, model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=0)
    optimized.save_model_to_file(out)
    log.info("onnx export fused: %s", optimized.get_fused_operator_statistics())
    return True


# int8 schemes, most int8 first: the worker serves the first that passes the fidelity gate. The FFN's
# down projection reads GELU/SwiGLU outputs whose outliers a per-tensor int8 scale flattens (it costs
# MiniLM ~0.01 of cosine); "attention" leaves every FFN in float32.
SCHEMES = ("all", "keep-ffn-down", "attention")
_FFN_ACTIVATIONS = {"Mul", "BiasGelu", "Gelu", "FastGelu", "QuickGelu"}


def ffn_down_nodes(graph) -> list[str]:
    """Weight MatMuls fed by an activation or an elementwise product: the FFN's down projections."""
    produced = {output: node for node in graph.node for output in node.output}
    weights = {init.name for init in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights
            and getattr(produced.get(node.input[0]), "op_type", None) in _FFN_ACTIVATIONS]


def quantize_int8(path: str, out: str, scheme: str = "all") -> None:
    """Dynamic int8: weights quantised once (per channel), activations per batch at run time; `scheme`
    (SCHEMES) says which operators stay in float32."""
    import onnx  # noqa: PLC0415 - the [onnx] extra
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    graph = onnx.load(path, load_external_data=False).graph
    exclude = ffn_down_nodes(graph) if scheme == "keep-ffn-down" else []
    ops = ["Attention"] if scheme == "attention" else None
    if scheme == "attention" and not any(node.op_type == "Attention" for node in graph.node):
        raise ValueError("no fused attention to quantise")
    logging.disable(logging.INFO)  # the quantiser logs a line per tensor on the root logger
    try:
        # The fused graph's com.microsoft operators defeat ONNX shape inference; their outputs are float32.
        quantize_dynamic(path, out, weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=exclude,
                         op_types_to_quantize=ops, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.disable(logging.NOTSET)


def versions() -> dict[str, str]:
    """What shapes an ONNX export: the exporter (torch, transformers) and the optimizer (onnxruntime, where
    installed: without it the export is not fused)."""
    import transformers  # noqa: PLC0415

    found = {"torch": torch.__version__, "transformers": transformers.__version__, "opset": str(OPSET)}
    try:
        import onnxruntime  # noqa: PLC0415 - the [onnx] extra

        found["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        found["onnxruntime"] = "none"
    return found
