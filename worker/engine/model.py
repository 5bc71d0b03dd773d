"""Loading a model folder (plain Hugging Face or sentence-transformers) and its forward pass.

`load_model` reads the sentence-transformers files (pooling, Dense, Normalize, prompts, max length) and
the HF config (Matryoshka), and returns a LoadedModel whose `embed` runs the transformer, pools and
applies the Dense layers: the "forward" step between preprocess (tokenise) and postprocess (cut,
normalise, cast).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from common.capabilities import MAX_EMBED_LEN, ModelCapabilities
from common.errors import StartupError
from worker.engine import backends
from worker.engine.backends import EngineChoice
from worker.engine.chat import chat_caps
from worker.engine.fidelity import cast_with_fidelity_check
from worker.engine.pooling import Pooler, modes_from_config
from worker.engine.stconfig import STConfig, read_st_config

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Dense(nn.Module):
    """sentence-transformers' Dense: Linear, then an activation, plus an optional residual."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: nn.Module | None = None, use_residual: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation or nn.Identity()
        self.residual = nn.Linear(in_features, out_features, bias=False) \
            if use_residual and in_features != out_features else None
        self.use_residual = use_residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


def _activation(path: str | None) -> nn.Module:
    """Only torch.nn Module classes are built from a config, as sentence-transformers does without
    trust_remote_code; anything else falls back to ST's default, Tanh."""
    if path and path.startswith("torch."):
        module_name, _, class_name = path.rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name, None)
        if inspect.isclass(cls) and issubclass(cls, nn.Module):
            return cls()
    if path:
        log.warning("activation %r is not a torch.nn module; using Tanh as sentence-transformers does", path)
    return nn.Tanh()


def _load_dense(folder: str) -> Dense:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    dense = Dense(config["in_features"], config["out_features"], config.get("bias", True),
                  _activation(config.get("activation_function", "torch.nn.modules.activation.Tanh")),
                  config.get("use_residual", False))
    weights = os.path.join(folder, "model.safetensors")
    if os.path.isfile(weights):
        from safetensors.torch import load_file  # noqa: PLC0415 - only for models with a Dense layer

        state = load_file(weights)
    else:
        state = torch.load(os.path.join(folder, "pytorch_model.bin"), map_location="cpu", weights_only=True)
    dense.load_state_dict(state)
    return dense


def _resolve_folder(path_or_id: str) -> str:
    if os.path.isdir(path_or_id):
        return path_or_id
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - a hub id only: use (or fill) the HF cache

    return snapshot_download(path_or_id)


def _served_name(path_or_id: str, served_name: str | None) -> str:
    if served_name:
        return served_name
    return os.path.basename(os.path.normpath(path_or_id)) if os.path.isdir(path_or_id) else path_or_id


def is_m3_folder(folder: str, transformer_path: str = "") -> bool:
    """bge-m3's `sparse_linear.pt` and `colbert_linear.pt` saved beside the encoder (worker/engine/bgem3.py)."""
    heads = ("sparse_linear.pt", "colbert_linear.pt")
    return any(all(os.path.isfile(os.path.join(folder, where, name)) for name in heads)
               for where in dict.fromkeys(("", transformer_path)))


def is_classifier(config) -> bool:
    """A sequence-classification checkpoint (a cross-encoder, a classifier): served for score/classify."""
    return any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])


def _is_decoder(config) -> bool:
    from transformers.models.auto.modeling_auto import (  # noqa: PLC0415 - transformers loads lazily
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return True
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES \
        and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _max_len(st: STConfig, tokenizer, config) -> int:
    """ST's max_seq_length if set, else the smaller of the tokenizer's and the position table's limit."""
    if st.max_seq_length:
        return int(st.max_seq_length)
    limits = []
    positions = getattr(config, "max_position_embeddings", None)
    if positions and positions > 0:
        if "roberta" in config.model_type or config.model_type == "camembert":
            positions -= (config.pad_token_id or 0) + 1  # RoBERTa positions start after the pad index
        limits.append(positions)
    if tokenizer.model_max_length and tokenizer.model_max_length < 10**9:
        limits.append(tokenizer.model_max_length)
    return min(limits) if limits else 512


def _matryoshka(config, dims: list[int] | None) -> tuple[bool, tuple[int, ...] | None]:
    """The flag wins over the HF config's `matryoshka_dimensions` list / `is_matryoshka` bool."""
    if dims:
        return True, tuple(sorted(set(dims)))
    declared = getattr(config, "matryoshka_dimensions", None)
    if declared:
        return True, tuple(sorted(set(int(d) for d in declared)))
    return bool(getattr(config, "is_matryoshka", False)), None


def _lowercase(tokenizer) -> None:
    """ST's do_lower_case: put a Lowercase step in front of the fast tokenizer's normalizer."""
    from tokenizers.normalizers import Lowercase, Sequence  # noqa: PLC0415 - only for do_lower_case

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    if current is not None and "Lowercase" in repr(current):
        return
    backend.normalizer = Sequence([Lowercase()] + ([current] if current is not None else []))


def load_transformer(folder: str, st: STConfig, auto_class, device) -> tuple:
    """The folder's tokenizer (with ST's do_lower_case) and its transformer as `auto_class` (AutoModel,
    AutoModelForMaskedLM, ...) loads it: float32 (a lower precision is cast after the fidelity check), in eval
    mode, on `device`."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, kept lazy

    model_dir = os.path.join(folder, st.transformer_path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if st.do_lower_case:
        _lowercase(tokenizer)
    return tokenizer, auto_class.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()


def pad_batch(token_lists: list[list[int]], pad_token_id: int, padding_side: str, device,
              position_ids: bool = False) -> dict[str, torch.Tensor]:
    """The model inputs of one batch: ids padded on `padding_side` and the attention mask, on `device`."""
    longest = max(len(ids) for ids in token_lists)
    input_ids = torch.full((len(token_lists), longest), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(token_lists), longest), dtype=torch.long)
    for row, ids in enumerate(token_lists):
        span = slice(longest - len(ids), longest) if padding_side == "left" else slice(0, len(ids))
        input_ids[row, span] = torch.as_tensor(ids, dtype=torch.long)
        attention[row, span] = 1
    inputs = {"input_ids": input_ids.to(device), "attention_mask": attention.to(device)}
    if position_ids and padding_side == "left":
        # Left padding must not shift positions: each text counts from 0 at its first real token.
        inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return inputs


@dataclass
class LoadedModel:
    """A tokenizer, a transformer, pooling, Dense layers and the capabilities requests are checked against."""

    tokenizer: object
    module: nn.Module
    pooler: Pooler
    dense: nn.Sequential
    caps: ModelCapabilities
    device: torch.device
    padding_side: str = "right"
    pad_token_id: int = 0
    _position_ids: bool = False
    _prompt_lengths: dict = field(default_factory=dict)
    fidelity: float = 1.0  # lowest probe cosine of the serving dtype against float32 (worker/engine/fidelity.py)
    token_dense: nn.Module | None = None  # a ColBERT-style folder's projection of every token state
    folder: str = ""  # the folder it was loaded from (a hub id's snapshot): the cache digests its files
    # --engine onnx/openvino (worker/engine/backends): runs the transformer in place of `module`
    backend: Callable[[dict], torch.Tensor] | None = None
    engine: str = "torch"  # the engine's label (torch, onnx, onnx-int8, ...): adverts, logs, cache identity
    packer: Callable | None = None  # --packed: runs a batch unpadded (worker/engine/packed.py)
    forward_layout: str = "padded"  # or "packed": adverts, logs

    def hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The transformer's last hidden state for pad_batch's inputs, on whichever engine serves."""
        if self.backend is not None:
            return self.backend(inputs)
        return self.module(**inputs).last_hidden_state

    def _forward(self, token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden states (rows, longest, hidden) and their mask: packed where --packed chose it."""
        if self.packer is not None:
            return self.packer(self, token_lists)
        inputs = pad_batch(token_lists, self.pad_token_id, self.padding_side, self.device, self._position_ids)
        return self.hidden_states(inputs), inputs["attention_mask"]

    @torch.inference_mode()
    def embed(self, token_lists: list[list[int]], prompt_lengths: list[int] | None = None) -> torch.Tensor:
        """One forward pass: pad, run the transformer, pool, Dense. Float32 (n, d) on the CPU."""
        hidden, mask = self._forward(token_lists)
        lengths = None if prompt_lengths is None else torch.as_tensor(prompt_lengths, device=self.device)
        pooled = self.pooler(hidden, mask, lengths)
        return self.dense(pooled).float().cpu()

    @torch.inference_mode()
    def token_embed(self, token_lists: list[list[int]]) -> list:
        """One forward pass for task token_embed: each row's real tokens' last hidden states (projected by
        `token_dense` where the folder has one), float32 (tokens, d) numpy arrays; padding left out."""
        hidden, mask = self._forward(token_lists)
        hidden = hidden.float()
        if self.token_dense is not None:
            hidden = self.token_dense(hidden)
        hidden, mask = hidden.cpu(), mask.bool().cpu()
        return [hidden[row][mask[row]].numpy() for row in range(len(token_lists))]

    def prompt_length(self, prompt: str, add_special_tokens: bool) -> int:
        """Tokens a prompt occupies at the front of a text, as ST counts them (minus a trailing special)."""
        key = (prompt, add_special_tokens)
        if key not in self._prompt_lengths:
            ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
            special = set(self.tokenizer.all_special_ids)
            self._prompt_lengths[key] = len(ids) - (1 if ids and ids[-1] in special else 0)
        return self._prompt_lengths[key]


def load_model(path_or_id: str, *, served_name: str | None = None, device: str | None = None,
               matryoshka_dims: list[int] | None = None, max_inputs: int = 2048,
               dtype: str | None = None, max_embed_len: int | None = None,
               trust_request_chat_template: bool = False, engine: EngineChoice | None = None,
               packed: str = "off") -> LoadedModel:
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
    packed: --packed auto|on|off, a batch run as one unpadded sequence where the probe texts agree
        (worker/engine/packed.py).
    """
    from transformers import AutoConfig, AutoModel  # noqa: PLC0415 - slow import, kept lazy

    folder = _resolve_folder(path_or_id)
    st = read_st_config(folder)
    model_dir = os.path.join(folder, st.transformer_path)
    engine = engine or EngineChoice()
    hf_config = AutoConfig.from_pretrained(model_dir)
    backends.check(engine, dtype=dtype, device=device, classifier=is_classifier(hf_config) and st.pooling is None
                   and not st.dense_paths)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() and not engine.on_cpu else "cpu"))
    if dtype is None:
        saved = hf_config.to_dict()  # not the attributes: transformers 5 warns on `torch_dtype`
        checkpoint = saved.get("dtype") or saved.get("torch_dtype")
        dtype = "float32" if device.type == "cpu" else \
            ("bfloat16" if str(checkpoint).endswith("bfloat16") else "float16")
    if device.type == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count() or 1)

    if st.splade is not None:  # a SPLADE SparseEncoder: sparse vectors only (worker/engine/splade.py)
        from worker.engine.splade import load_splade  # noqa: PLC0415 - only for such folders

        return load_splade(folder, st, hf_config, name=_served_name(path_or_id, served_name), device=device,
                           dtype=dtype, max_inputs=max_inputs, trust_request_chat_template=trust_request_chat_template)
    if is_classifier(hf_config) and st.pooling is None and not st.dense_paths:  # a cross-encoder, a classifier
        from worker.engine.tasks.classifier import load_classifier  # noqa: PLC0415 - only for such folders

        return load_classifier(folder, st, hf_config, name=_served_name(path_or_id, served_name), device=device,
                               dtype=dtype, max_inputs=max_inputs,
                               trust_request_chat_template=trust_request_chat_template)
    # Loaded in float32 and cast after the fidelity check below (worker/engine/fidelity.py).
    tokenizer, module = load_transformer(folder, st, AutoModel, device)
    decoder = _is_decoder(hf_config)

    if st.pooling is not None:
        pooler = Pooler(modes_from_config(st.pooling), bool(st.pooling.get("include_prompt", True)))
        normalize = st.normalize
    else:
        # No sentence-transformers files: do what vLLM does for an unknown embedding model, i.e. the
        # model's own default pooler -- last token for decoders, CLS for BERT-style encoders -- and
        # normalise by default (vLLM's embed task normalises unless told otherwise).
        pooler = Pooler(("lasttoken",) if decoder else ("cls",))
        normalize = True
    dense = nn.Sequential(*(_load_dense(os.path.join(folder, p)) for p in st.dense_paths))
    dense = dense.to(device).eval()  # stays float32: tiny, and pooling hands it float32
    # pylate's ColBERT layout (Transformer -> Dense, no Pooling): the Dense projects every token state and
    # the model serves multi-vector tasks only, normalised per token as ColBERT scores them.
    colbert = st.pooling is None and bool(st.dense_paths)
    if colbert:
        normalize = True

    hidden = hf_config.get_text_config().hidden_size
    embedding_size = dense[-1].linear.out_features if len(dense) else hidden * len(pooler.modes)
    is_matryoshka, dims = _matryoshka(hf_config, matryoshka_dims)
    pad = tokenizer.pad_token_id
    if pad is None:  # decoders often have no pad token; any id works, padded positions are masked
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    max_len = _max_len(st, tokenizer, hf_config)
    if max_embed_len is not None and not max_len < max_embed_len <= MAX_EMBED_LEN:
        raise StartupError(f"--max-embed-len {max_embed_len} must exceed the model's max length ({max_len}: "
                           f"shorter inputs need no chunks) and be at most {MAX_EMBED_LEN} tokens")
    if max_embed_len is not None and (pooler.modes != ("mean",) or len(dense)):
        log.warning("--max-embed-len on a model with %s pooling%s: a long input's vector is the length-weighted "
                    "mean of its chunks' vectors, which only mean pooling makes the mean over its tokens (as vLLM "
                    "warns too)", pooler.name, " and Dense layers" if len(dense) else "")
    caps = ModelCapabilities(
        name=_served_name(path_or_id, served_name),
        max_model_len=max_len,
        embedding_size=embedding_size,
        vocab_size=module.get_input_embeddings().num_embeddings,
        pooling=pooler.name,
        normalize=normalize,
        is_matryoshka=is_matryoshka,
        matryoshka_dimensions=dims,
        prompts=st.prompts,
        default_prompt_name=st.default_prompt_name,
        truncation_side=getattr(tokenizer, "truncation_side", "right") or "right",
        max_inputs=max_inputs,
        tasks=("token_embed", "score", "tokenize", "detokenize") if colbert
        else ("embed", "score", "token_embed", "tokenize", "detokenize"),
        token_size=embedding_size if colbert else hidden,
        max_embed_len=max_embed_len,
        **chat_caps(tokenizer, trust_request_chat_template),
    )
    loaded = LoadedModel(
        tokenizer=tokenizer, module=module, pooler=pooler, dense=dense, caps=caps,
        device=device, padding_side=getattr(tokenizer, "padding_side", "right") or "right",
        pad_token_id=pad,
        _position_ids="position_ids" in inspect.signature(module.forward).parameters, folder=folder,
        token_dense=dense if colbert else None,
    )
    if is_m3_folder(folder, st.transformer_path):  # bge-m3: sparse and ColBERT heads too (worker/engine/bgem3.py)
        from worker.engine.bgem3 import load_m3  # noqa: PLC0415 - bgem3 builds on this module

        loaded = load_m3(loaded, model_dir)
    if dtype != "float32":
        loaded.fidelity = cast_with_fidelity_check(loaded, _DTYPES[dtype])
    if engine.on_cpu:
        backends.attach(loaded, engine, model_dir, hf_config)
    if isinstance(loaded, LoadedModel):  # bge-m3: its dense vectors packed, its heads run their own padded pass
        from worker.engine.packed import choose  # noqa: PLC0415 - packing is its own module

        choose(loaded, packed)
    return loaded
