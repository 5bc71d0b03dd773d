"""Which kind a model folder is, and its loader: `load_model`, the one entry point of worker/engine/models.

Each kind is a module with `matches(folder, st, hf_config)` and `load(folder, st, hf_config, options)`; KINDS
asks them in order and the first that matches loads the folder. Adding a kind is a module here and a line
in KINDS. The null model (`--model null:<dim>`, models/nullmodel.py) needs no folder and no torch: the worker's
entry point builds it without this module.

A folder the worker cannot serve exactly is refused here, in one line that names the folder and the reason
(StartupError), before the worker advertises anything.
"""

from __future__ import annotations

import logging
import os

import torch

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine import backends
from embedfleet.worker.engine.backends import EngineChoice
from embedfleet.worker.engine.models import bgem3, classifier, embedding, plaintext, splade
from embedfleet.worker.engine.models.base import NOT_TEXT_ENCODERS, LoadedModel, LoadOptions
from embedfleet.worker.engine.models.folderchecks import check_positions
from embedfleet.worker.engine.models.stconfig import read_st_config

log = logging.getLogger(__name__)

# First match wins; embedding (plain Hugging Face / sentence-transformers) matches any folder, so it is last.
KINDS = (splade, classifier, bgem3, embedding)


def _resolve_folder(path_or_id: str) -> str:
    if os.path.isdir(path_or_id):
        return path_or_id
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - a hub id only: use (or fill) the HF cache

    return snapshot_download(path_or_id)


def _served_name(path_or_id: str, served_name: str | None) -> str:
    if served_name:
        return served_name
    return os.path.basename(os.path.normpath(path_or_id)) if os.path.isdir(path_or_id) else path_or_id


def load_model(path_or_id: str, *, served_name: str | None = None, device: str | None = None,
               matryoshka_dims: list[int] | None = None, max_inputs: int = 2048,
               dtype: str | None = None, max_embed_len: int | None = None,
               trust_request_chat_template: bool = False, engine: EngineChoice | None = None,
               raw_text: bool = False, packed: str = "off") -> LoadedModel:
    """Load a HF or sentence-transformers model folder (or hub id) for serving.

    device: None picks "cuda" when available, else "cpu". dtype: "float32", "float16" or "bfloat16";
    None means float32 on CPU and, on CUDA, bfloat16 for a bfloat16 checkpoint else float16 (vLLM's
    "auto"); anything but float32 must pass the fidelity check in worker/engine/fidelity.py.
    served_name: the model name requests use (default: the folder or hub name).
    matryoshka_dims: the Matryoshka sizes the model allows (the --matryoshka-dims flag).
    max_embed_len: inputs up to this many tokens are embedded in chunks of the max length (--max-embed-len);
        it must exceed the model's max length.
    trust_request_chat_template: render a chat template sent with a request (--trust-request-chat-template);
        off, only the tokenizer's own renders `messages`.
    engine: --engine/--quantize/--fidelity-gate (worker/engine/backends); None: torch. A CPU engine runs on
        the CPU in float32 or int8 and must agree with float32 torch on the probe texts.
    raw_text: tokenise plain strings as they are (vLLM's handling, --raw-text) even where the folder's
        modality_config renders them through the chat template as sentence-transformers does
        (worker/engine/models/plaintext.py).
    packed: --packed auto|on|off, a batch run as one unpadded sequence where the probe texts agree
        (worker/engine/packed.py).
    """
    folder = _resolve_folder(path_or_id)
    st = read_st_config(folder)
    model_dir = os.path.join(folder, st.transformer_path)
    engine = engine or EngineChoice()
    hf_config = _hf_config(folder, model_dir)
    backends.check(engine, dtype=dtype, device=device, classifier=classifier.matches(folder, st, hf_config))
    device = torch.device(device or ("cuda" if torch.cuda.is_available() and not engine.on_cpu else "cpu"))
    if dtype is None:
        saved = hf_config.to_dict()  # not the attributes: transformers 5 warns on `torch_dtype`
        checkpoint = saved.get("dtype") or saved.get("torch_dtype")
        dtype = "float32" if device.type == "cpu" else \
            ("bfloat16" if str(checkpoint).endswith("bfloat16") else "float16")

    options = LoadOptions(name=_served_name(path_or_id, served_name), device=device, dtype=dtype,
                          max_inputs=max_inputs, matryoshka_dims=matryoshka_dims, max_embed_len=max_embed_len,
                          trust_request_chat_template=trust_request_chat_template, engine=engine, raw_text=raw_text,
                          packed=packed)
    kind = next(kind for kind in KINDS if kind.matches(folder, st, hf_config))
    try:
        loaded = kind.load(folder, st, hf_config, options)
    except StartupError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, ImportError) as exc:
        # transformers, tokenizers and torch refuse a folder with all of these (ImportError: a model class
        # that needs a package this install lacks)
        raise _refusal(folder, "cannot be loaded", exc) from exc
    check_positions(folder, loaded.module, loaded.caps.max_model_len)
    _smoke(folder, loaded)
    if getattr(loaded, "plain_text", None) is not None:
        log.info("model folder %s: plain text is rendered as a user message through the chat template, as "
                 "sentence-transformers does for its modality_config (--raw-text tokenises it as is)", folder)
    return loaded


def _hf_config(folder: str, model_dir: str):
    """The folder's transformers config; a model type the worker cannot feed text to is refused."""
    from transformers import AutoConfig  # noqa: PLC0415 - slow import, kept lazy

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise _refusal(folder, "has no config transformers can read", exc) from exc
    if config.model_type in NOT_TEXT_ENCODERS:
        raise StartupError(f"model folder {folder}: model type {config.model_type!r} is not served (embedfleet "
                           "embeds text with a text encoder; this one takes audio or images, or needs the "
                           "config rewritten as sentence-transformers does)")
    return config


def _smoke(folder: str, loaded) -> None:
    """One short text through the forward pass, so that a folder whose model cannot run (a missing input, an
    unsupported layer) is refused now in one line, not by the start-up probe as an unexpected error."""
    tokenizer = loaded.tokenizer
    spec = getattr(loaded, "plain_text", None)
    try:
        # a folder that renders plain text through its template must render this one (models/plaintext.py)
        ids = plaintext.render_ids(tokenizer, spec, ["embedfleet start-up check"], None)[0] if spec \
            else tokenizer("embedfleet start-up check", add_special_tokens=True)["input_ids"]
        loaded.embed([ids[:8] or [0]])
    except Exception as exc:  # any failure of the model's own code is the folder's refusal
        raise _refusal(folder, "fails on a test input", exc) from exc


def _refusal(folder: str, what: str, exc: BaseException) -> StartupError:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return StartupError(f"model folder {folder} {what}: {type(exc).__name__}: {first}")
