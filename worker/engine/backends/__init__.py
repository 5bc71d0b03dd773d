"""CPU engines for the transformer's forward pass: torch (default), ONNX Runtime, OpenVINO.

Only the transformer changes: `attach` hands a LoadedModel a backend that maps padded inputs to the last
hidden state, after checking it against float32 torch on the probe texts (worker/engine/fidelity.py).
Tokeniser, pooling, Dense, normalisation, Matryoshka and every task stay in worker/engine, shared.
"""

from __future__ import annotations

import logging

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.backends.choice import GATES, EngineChoice
from embedfleet.worker.engine.models.base import pad_batch

log = logging.getLogger(__name__)

ENGINES = ("torch", "onnx", "openvino")
_EXTRAS = {"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "openvino")}


def check(choice: EngineChoice, *, dtype: str | None, device: str | None, classifier: bool) -> None:
    """Refuse, in one line, what an engine cannot serve; before any export is made."""
    if choice.engine not in ENGINES:
        raise StartupError(f"--engine {choice.engine!r} is unknown; choose one of {', '.join(ENGINES)}")
    if choice.quantize not in GATES:
        raise StartupError(f"--quantize {choice.quantize!r} is unknown; the one choice is int8")
    if not choice.on_cpu:
        if choice.quantize:
            raise StartupError("--quantize int8 needs --engine onnx or --engine openvino (torch serves float32, "
                               "float16 or bfloat16: --dtype)")
        return
    if dtype not in (None, "float32"):
        raise StartupError(f"--dtype {dtype} is for --engine torch; --engine {choice.engine} runs float32 "
                           "(--quantize int8 for its int8)")
    if device and not device.startswith("cpu"):
        raise StartupError(f"--engine {choice.engine} runs on the CPU; pass --device cpu, or serve with "
                           "--engine torch on {device}")
    if classifier:
        raise StartupError(f"--engine {choice.engine} serves embedding models (tasks embed, score, token_embed); "
                           "this folder is a sequence classifier: serve it with --engine torch")
    module, extra = _EXTRAS[choice.engine]
    try:
        __import__(module)
    except ImportError as exc:
        raise StartupError(f"--engine {choice.engine} needs {module}: pip install 'embedfleet[{extra}]'") from exc


def attach(loaded, choice: EngineChoice, model_dir: str, hf_config) -> None:
    """Give `loaded` (a float32 torch LoadedModel) the chosen engine's forward, or raise StartupError when it
    falls below the gate; its torch weights are then released (only the module's config is kept)."""
    from embedfleet.worker.engine import cpus  # noqa: PLC0415
    from embedfleet.worker.engine.backends import cache  # noqa: PLC0415 - the backends load their runtimes lazily
    from embedfleet.worker.engine.backends.calibration import calibration_samples  # noqa: PLC0415
    from embedfleet.worker.engine.fidelity import engine_fidelity  # noqa: PLC0415
    from embedfleet.worker.engine.identity import folder_digest  # noqa: PLC0415

    root = choice.cache_dir or cache.default_root()
    digest = folder_digest(loaded.folder)
    threads = choice.threads or cpus.affinity()
    left = loaded.padding_side == "left"
    if choice.engine == "onnx":
        from embedfleet.worker.engine.backends import onnx  # noqa: PLC0415

        def build(scheme: str):
            return onnx.load(model_dir, hf_config, quantize=choice.quantize, files_digest=digest, root=root,
                             threads=threads, left_padding=left, scheme=scheme, spinning=choice.spinning)
        schemes = onnx.SCHEMES
    else:
        from embedfleet.worker.engine.backends import onnx, openvino  # noqa: PLC0415

        def calibration() -> list:
            limit = loaded.caps.max_model_len
            return [pad_batch([loaded.tokenizer(text, truncation=True, max_length=limit)["input_ids"]],
                              loaded.pad_token_id, loaded.padding_side, "cpu", loaded._position_ids)
                    for text in calibration_samples()]

        def build(scheme: str):
            return openvino.load(
                model_dir, lambda: onnx.export_folder(model_dir, hf_config, files_digest=digest, root=root,
                                                      left_padding=left),
                quantize=choice.quantize, files_digest=digest, root=root, threads=threads, calibration=calibration,
                scheme=scheme)
        schemes = openvino.SCHEMES
    # int8: the most int8 scheme that passes the gate (an unquantised export has the one).
    refusal = None
    for scheme in schemes if choice.quantize else schemes[:1]:
        backend = _built(build, scheme, choice, loaded.caps.name)
        if backend is None:
            continue
        try:
            loaded.fidelity = engine_fidelity(loaded, backend, choice.min_cosine, choice.label)
        except StartupError as exc:
            refusal = exc
            if choice.quantize:
                log.info("engine %s: int8 layout %s is below the gate (%s)", choice.label, scheme, exc)
            continue
        break
    else:
        raise refusal or StartupError(f"--engine {choice.label} has no int8 scheme for model '{loaded.caps.name}'; "
                                      f"serve it without --quantize")
    loaded.engine = choice.label
    loaded.module.to("meta")  # the backend holds its own weights; torch's are not needed any more
    # torch now only pools and projects (tiny ops); its OpenMP threads would spin-wait after each of them
    # on the cores the engine's own thread pool needs.
    import torch  # noqa: PLC0415 - loaded already; kept out of the module's imports like the backends

    torch.set_num_threads(1)
    log.info("engine %s: %s; probe cosine vs float32 torch %.6f (gate %s)", choice.label, backend.describe(),
             loaded.fidelity, choice.min_cosine)


def _built(build, scheme: str, choice: EngineChoice, name: str):
    """build(scheme), or StartupError in one line (the traceback in the log); None: a scheme that does not
    apply to this graph (an int8 scheme after the first)."""
    try:
        return build(scheme)
    except StartupError:
        raise
    except Exception as exc:  # an exporter or runtime failure
        if choice.quantize and scheme != "all":
            log.info("engine %s: int8 scheme %s does not apply: %s", choice.label, scheme, exc)
            return None
        log.exception("the %s engine could not be built", choice.label)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise StartupError(f"--engine {choice.label} could not export or load model '{name}': "
                           f"{type(exc).__name__}: {first}; serve it with --engine torch") from exc
