"""The pieces every model kind shares (a leaf: it imports no other module of worker/engine/models but the leaf
folderchecks).

Dtypes, sentence-transformers' Dense and its activation, the max length, the tokenizer + transformer loading
(the class sentence-transformers picks: `feature_class`), `pad_batch`, and LoadedModel, whose `embed` runs the
transformer, pools and applies the Dense layers: the "forward" step between preprocess (tokenise) and
postprocess (cut, normalise, cast). worker/engine/models/loader.py decides which kind a folder is.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import nn

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.models import folderchecks
from embedfleet.worker.engine.pooling import Pooler

if TYPE_CHECKING:  # types only: the leaf imports no sibling at run time
    from embedfleet.common.request import EmbedRequest
    from embedfleet.worker.engine.backends.choice import EngineChoice
    from embedfleet.worker.engine.seam import Prepared
    from embedfleet.worker.engine.models.plaintext import MessageText
    from embedfleet.worker.engine.models.stconfig import STConfig

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


def activation(path: str | None) -> nn.Module:
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


def load_dense(folder: str) -> Dense:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    dense = Dense(config["in_features"], config["out_features"], config.get("bias", True),
                  activation(config.get("activation_function", "torch.nn.modules.activation.Tanh")),
                  config.get("use_residual", False))
    weights = os.path.join(folder, "model.safetensors")
    if os.path.isfile(weights):
        from safetensors.torch import load_file  # noqa: PLC0415 - only for models with a Dense layer

        state = load_file(weights)
    else:
        state = torch.load(os.path.join(folder, "pytorch_model.bin"), map_location="cpu", weights_only=True)
    dense.load_state_dict(state)
    return dense


def max_len(st: STConfig, tokenizer, config, module: nn.Module | None = None) -> int:
    """ST's max_seq_length if set (models/loader.py refuses one past the position table), else the smaller of the
    tokenizer's and the positions' limit: the module's absolute position table where it has one (MPNet's starts
    after its padding index, whatever the config says), else the config's max_position_embeddings."""
    if st.max_seq_length:
        return int(st.max_seq_length)
    limits = []
    positions = getattr(config, "max_position_embeddings", None)
    table = folderchecks.position_limit(module) if module is not None else None
    if table is not None:
        limits.append(table)
    elif positions and positions > 0:
        if "roberta" in config.model_type or config.model_type == "camembert":
            positions -= (config.pad_token_id or 0) + 1  # RoBERTa positions start after the pad index
        limits.append(positions)
    if tokenizer.model_max_length and tokenizer.model_max_length < 10**9:
        limits.append(tokenizer.model_max_length)
    return min(limits) if limits else 512


def lowercase(tokenizer) -> None:
    """ST's do_lower_case: put a Lowercase step in front of the fast tokenizer's normalizer."""
    from tokenizers.normalizers import Lowercase, Sequence  # noqa: PLC0415 - only for do_lower_case

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    if current is not None and "Lowercase" in repr(current):
        return
    backend.normalizer = Sequence([Lowercase()] + ([current] if current is not None else []))


# sentence-transformers' Transformer module loads only the encoder of these encoder-decoder configs
# (_ENCODER_ONLY_MODELS in sentence_transformers/base/modules/transformer.py), where AutoModel would build the
# whole model with a randomly initialised decoder: (config class, module, encoder class), all in transformers.
# ST's audio/vision entries (Whisper, Moonshine, Udop) and T5Gemma/T5Gemma2 are refused instead (not text,
# or a config that ST rewrites before loading): models/loader.py says so in one line.
ENCODER_ONLY = (
    ("T5Config", "transformers", "T5EncoderModel"),
    ("MT5Config", "transformers", "MT5EncoderModel"),
    ("UMT5Config", "transformers", "UMT5EncoderModel"),
    ("LongT5Config", "transformers", "LongT5EncoderModel"),
    ("ProphetNetConfig", "transformers", "ProphetNetEncoder"),
    ("SwitchTransformersConfig", "transformers", "SwitchTransformersEncoderModel"),
    ("BlenderbotConfig", "transformers.models.blenderbot.modeling_blenderbot", "BlenderbotEncoder"),
    ("BlenderbotSmallConfig", "transformers.models.blenderbot_small.modeling_blenderbot_small",
     "BlenderbotSmallEncoder"),
    ("M2M100Config", "transformers.models.m2m_100.modeling_m2m_100", "M2M100Encoder"),
    ("PegasusConfig", "transformers.models.pegasus.modeling_pegasus", "PegasusEncoder"),
    ("PegasusXConfig", "transformers.models.pegasus_x.modeling_pegasus_x", "PegasusXEncoder"),
    ("MarianConfig", "transformers.models.marian.modeling_marian", "MarianEncoder"),
)
NOT_TEXT_ENCODERS = ("whisper", "moonshine", "udop", "t5gemma", "t5gemma2")  # model_type: refused, see above


def feature_class(config):
    """The class sentence-transformers' Transformer loads a feature-extraction folder with: the encoder alone
    for an ENCODER_ONLY config (a T5 / sentence-T5 / GTR folder gets T5EncoderModel), else AutoModel."""
    import transformers  # noqa: PLC0415 - slow import, kept lazy (the null model and common never need it)

    for config_name, module_path, class_name in ENCODER_ONLY:
        config_class = getattr(transformers, config_name, None)
        if config_class is not None and isinstance(config, config_class):
            return getattr(importlib.import_module(module_path), class_name)
    return transformers.AutoModel


def load_transformer(folder: str, st: STConfig, auto_class, device) -> tuple:
    """The folder's tokenizer (with ST's do_lower_case) and its transformer as `auto_class` (AutoModel,
    AutoModelForMaskedLM, ...) loads it: float32 (a lower precision is cast after the fidelity check), in eval
    mode, on `device`. A tokenizer or weights that are not the folder's own are refused (models/folderchecks.py)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, kept lazy

    model_dir = os.path.join(folder, st.transformer_path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if st.do_lower_case:
        lowercase(tokenizer)
    folderchecks.check_tokenizer(folder, model_dir, tokenizer)
    module, loading = auto_class.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    folderchecks.check_weights(folder, module, loading)
    folderchecks.check_vocabulary(folder, tokenizer, module)
    return tokenizer, module.to(device).eval()


def pad_batch(token_lists: list[list[int]], pad_token_id: int, padding_side: str, device,
              position_ids: bool = False) -> dict[str, torch.Tensor]:
    """The model inputs of one batch: ids padded on `padding_side` and the attention mask, on `device`."""
    # Padded in numpy, not row by row in Python (a GPU waited for that loop): a boolean mask of the real
    # positions, filled in row-major order, takes the concatenated ids as they come.
    lengths = np.fromiter(map(len, token_lists), np.int64, len(token_lists))
    longest = int(lengths.max())
    columns = np.arange(longest)
    real = columns >= (longest - lengths)[:, None] if padding_side == "left" else columns < lengths[:, None]
    ids = np.full(real.shape, pad_token_id, np.int64)
    ids[real] = np.fromiter(itertools.chain.from_iterable(token_lists), np.int64, int(lengths.sum()))
    inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(real.astype(np.int64))}
    stageclock.lap("collate")
    if torch.device(device).type == "cuda":  # one pinned, non-blocking copy each
        inputs = {name: tensor.pin_memory().to(device, non_blocking=True) for name, tensor in inputs.items()}
    else:
        inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    if position_ids and padding_side == "left":
        # Left padding must not shift positions: each text counts from 0 at its first real token.
        inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    stageclock.lap("h2d")
    return inputs


@dataclass(frozen=True)
class LoadOptions:
    """What every kind's loader is told besides the folder (load_model's arguments, resolved)."""

    name: str  # the served model name
    device: torch.device
    dtype: str  # float32, float16 or bfloat16 (decided by load_model)
    max_inputs: int = 2048
    matryoshka_dims: list[int] | None = None
    max_embed_len: int | None = None
    trust_request_chat_template: bool = False
    engine: EngineChoice | None = None  # None: torch
    raw_text: bool = False  # plain strings tokenised as is even where the folder renders them as messages
    packed: str = "off"  # --packed auto|on|off: a batch run as one unpadded sequence (worker/engine/packed.py)


class Model(Protocol):
    """What the engine (worker/engine/engine.py) asks of every model: LoadedModel and its kinds (M3Model),
    ClassifierModel, SpladeModel, NullModel. A kind serves the tasks its `caps` advertise and has what they
    call: `tokenizer` and `prompt_length` (preprocess), `token_embed` (per-token rows), `outputs` (a multi-head
    or sparse model's parts, worker/engine/tasks/sparse.py)."""

    caps: ModelCapabilities
    fidelity: float  # lowest probe cosine of the serving dtype against float32 (worker/engine/fidelity.py)
    # a model that tokenises its own way (the null model): a request -> its inputs, prepared; None: the engine
    # tokenises with the model's tokenizer (worker/engine/preprocess.py)
    prepare: Callable[[EmbedRequest], Prepared] | None

    def embed(self, token_lists: list[list[int]], prompt_lengths: list[int] | None = None):
        """One forward pass over these rows: (n, d) float32 vectors, a torch tensor on the CPU or numpy."""
        ...


@dataclass
class LoadedModel:
    """A tokenizer, a transformer, pooling, Dense layers and the capabilities requests are checked against."""

    prepare = None  # tokenised by the engine (Model); not a field

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
    # a plain string is rendered as a user message through the chat template, as sentence-transformers 6 does
    # for a folder whose modality_config has `message` (worker/engine/models/plaintext.py); None: tokenised as is
    plain_text: MessageText | None = None
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
        """One forward pass: pad (or pack), run the transformer, pool, Dense. Float32 (n, d) on the CPU."""
        stageclock.lap("other")
        hidden, mask = self._forward(token_lists)
        stageclock.lap("forward")
        lengths = None if prompt_lengths is None else torch.as_tensor(prompt_lengths, device=self.device)
        pooled = self.dense(self.pooler(hidden, mask, lengths)).float()
        stageclock.lap("pooling")
        vectors = pooled.cpu()
        stageclock.lap("d2h")
        return vectors

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
