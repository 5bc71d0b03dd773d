"""Plain Hugging Face and sentence-transformers embedding folders: Transformer -> Pooling -> Dense -> Normalize
(or pylate's ColBERT Transformer -> Dense), loaded with the class sentence-transformers picks
(models/base.py feature_class: the encoder alone for a T5 folder).

`build` makes the float32 torch LoadedModel (bge-m3's loader adds its heads to it); `ready_to_serve` casts it to the
serving dtype behind the fidelity check or hands the forward to a CPU engine.
"""

from __future__ import annotations

import inspect
import logging
import os

import torch
from torch import nn

from embedfleet.common.capabilities import MAX_EMBED_LEN, ModelCapabilities
from embedfleet.common.errors import StartupError
from embedfleet.worker.engine import backends, packed
from embedfleet.worker.engine.chat import chat_caps
from embedfleet.worker.engine.fidelity import cast_with_fidelity_check
from embedfleet.worker.engine.models.base import (DTYPES, LoadedModel, LoadOptions, feature_class, load_dense,
                                                  load_transformer, max_len)
from embedfleet.worker.engine.models.plaintext import message_text
from embedfleet.worker.engine.models.stconfig import STConfig
from embedfleet.worker.engine.pooling import Pooler, modes_from_config

log = logging.getLogger(__name__)


def matches(folder: str, st: STConfig, hf_config) -> bool:
    """Any folder no other kind claims (models/loader.py asks this kind last)."""
    return True


def is_decoder(config) -> bool:
    """A causal LM (GPT-2, Qwen, ...): a folder without ST files pools its last token, as vLLM does."""
    from transformers.models.auto.modeling_auto import (  # noqa: PLC0415 - transformers loads lazily
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return True
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES \
        and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _matryoshka(config, dims: list[int] | None) -> tuple[bool, tuple[int, ...] | None]:
    """The flag wins over the HF config's `matryoshka_dimensions` list / `is_matryoshka` bool."""
    if dims:
        return True, tuple(sorted(set(dims)))
    declared = getattr(config, "matryoshka_dimensions", None)
    if declared:
        return True, tuple(sorted(set(int(d) for d in declared)))
    return bool(getattr(config, "is_matryoshka", False)), None


def build(folder: str, st: STConfig, hf_config, options: LoadOptions) -> LoadedModel:
    """The folder's tokenizer, transformer (float32, on the device), pooling, Dense layers and capabilities."""
    # Loaded in float32; `ready_to_serve` casts it after the fidelity check (worker/engine/fidelity.py).
    tokenizer, module = load_transformer(folder, st, feature_class(hf_config), options.device)
    decoder = is_decoder(hf_config)

    if st.pooling is not None:
        pooler = Pooler(modes_from_config(st.pooling), bool(st.pooling.get("include_prompt", True)))
        normalize = st.normalize
    else:
        # No sentence-transformers files: do what vLLM does for an unknown embedding model, i.e. the
        # model's own default pooler -- last token for decoders, CLS for BERT-style encoders -- and
        # normalise by default (vLLM's embed task normalises unless told otherwise).
        pooler = Pooler(("lasttoken",) if decoder else ("cls",))
        normalize = True
    dense = nn.Sequential(*(load_dense(os.path.join(folder, p)) for p in st.dense_paths))
    dense = dense.to(options.device).eval()  # stays float32: tiny, and pooling hands it float32
    # pylate's ColBERT layout (Transformer -> Dense, no Pooling): the Dense projects every token state and
    # the model serves multi-vector tasks only, normalised per token as ColBERT scores them.
    colbert = st.pooling is None and bool(st.dense_paths)
    if colbert:
        normalize = True

    hidden = hf_config.get_text_config().hidden_size
    embedding_size = dense[-1].linear.out_features if len(dense) else hidden * len(pooler.modes)
    is_matryoshka, dims = _matryoshka(hf_config, options.matryoshka_dims)
    pad = tokenizer.pad_token_id
    if pad is None:  # decoders often have no pad token; any id works, padded positions are masked
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    longest = max_len(st, tokenizer, hf_config, module)
    if options.max_embed_len is not None and not longest < options.max_embed_len <= MAX_EMBED_LEN:
        raise StartupError(f"--max-embed-len {options.max_embed_len} must exceed the model's max length ({longest}: "
                           f"shorter inputs need no chunks) and be at most {MAX_EMBED_LEN} tokens")
    if options.max_embed_len is not None and (pooler.modes != ("mean",) or len(dense)):
        log.warning("--max-embed-len on a model with %s pooling%s: a long input's vector is the length-weighted "
                    "mean of its chunks' vectors, which only mean pooling makes the mean over its tokens (as vLLM "
                    "warns too)", pooler.name, " and Dense layers" if len(dense) else "")
    caps = ModelCapabilities(
        name=options.name,
        max_model_len=longest,
        embedding_size=embedding_size,
        vocab_size=module.get_input_embeddings().num_embeddings,
        pooling=pooler.name,
        normalize=normalize,
        is_matryoshka=is_matryoshka,
        matryoshka_dimensions=dims,
        prompts=st.prompts,
        default_prompt_name=st.default_prompt_name,
        truncation_side=getattr(tokenizer, "truncation_side", "right") or "right",
        max_inputs=options.max_inputs,
        tasks=("token_embed", "score", "tokenize", "detokenize") if colbert
        else ("embed", "score", "token_embed", "tokenize", "detokenize"),
        token_size=embedding_size if colbert else hidden,
        max_embed_len=options.max_embed_len,
        **chat_caps(tokenizer, options.trust_request_chat_template),
    )
    loaded = LoadedModel(
        tokenizer=tokenizer, module=module, pooler=pooler, dense=dense, caps=caps,
        device=options.device, padding_side=getattr(tokenizer, "padding_side", "right") or "right",
        pad_token_id=pad,
        _position_ids="position_ids" in inspect.signature(module.forward).parameters, folder=folder,
        token_dense=dense if colbert else None,
        plain_text=None if options.raw_text else message_text(
            folder, st.modality_config, st.processing_kwargs, tokenizer, hf_config.model_type),
    )
    return loaded


def ready_to_serve(loaded: LoadedModel, st: STConfig, hf_config, options: LoadOptions) -> LoadedModel:
    """The float32 torch model handed to a CPU engine, or packed where its gate passes and cast to the serving
    dtype behind the dtype's fidelity check, which then judges the path that serves (packed or padded).

    Packing is gated in float32, before the cast: whether texts stay apart is the architecture's property, and
    in half precision two correct paths already differ by the dtype's rounding (MiniLM in bfloat16: packed vs
    padded 0.99992), which a gate of 0.99999 would always refuse and a looser one could not tell from texts
    that see each other (DeBERTa-v2: 0.9998)."""
    if options.engine is not None and options.engine.on_cpu:  # float32 only (backends.check): nothing to cast
        backends.attach(loaded, options.engine, os.path.join(loaded.folder, st.transformer_path), hf_config)
    dtype = DTYPES[options.dtype]
    packed.choose(loaded, options.packed, dtype)  # bge-m3: its dense vectors packed, its heads run their own pass
    if dtype != torch.float32:
        loaded.fidelity = _cast(loaded, dtype)
    return loaded


def _cast(loaded: LoadedModel, dtype: torch.dtype) -> float:
    """The dtype's fidelity check on the path that serves; packed and refused there (or its half-precision
    kernel failing: CUDA's varlen attention first runs here), padded gets its own try."""
    try:
        return cast_with_fidelity_check(loaded, dtype)
    except Exception as exc:  # whatever the packed path did, padded is judged on its own
        if loaded.packer is None:
            raise
        loaded.module.to(torch.float32)  # a kernel that raised left the module cast
        first = str(exc).splitlines()[0] if str(exc) else ""
        packed.unpack(loaded, f"packed in {str(dtype).removeprefix('torch.')} fails ({type(exc).__name__}: {first})")
        return cast_with_fidelity_check(loaded, dtype)


def load(folder: str, st: STConfig, hf_config, options: LoadOptions) -> LoadedModel:
    """A Transformer -> Pooling -> Dense -> Normalize folder (or a plain HF one, with vLLM's defaults)."""
    return ready_to_serve(build(folder, st, hf_config, options), st, hf_config, options)
