"""Reading a sentence-transformers folder's config files (modules.json and friends) without importing ST."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from embedfleet.common.errors import StartupError


@dataclass
class STConfig:
    """What the sentence-transformers files of a model folder say; defaults when there are none."""

    present: bool = False  # modules.json exists
    transformer_path: str = ""  # folder of the HF model and tokenizer, relative to the root
    pooling: dict | None = None  # 1_Pooling/config.json
    dense_paths: list[str] = field(default_factory=list)  # in module order
    normalize: bool = False  # a Normalize module is present
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    splade: dict | None = None  # a SparseEncoder's SpladePooling config (its transformer is an MLMTransformer)
    # sentence_bert_config.json of sentence-transformers 6: which inputs the Transformer takes ("text", "message":
    # plain strings rendered through the chat template, worker/engine/models/plaintext.py) and its kwargs
    modality_config: dict | None = None
    processing_kwargs: dict = field(default_factory=dict)


def _read_json(path: str) -> dict | list | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _kind(module_type: str) -> str:
    """Last name of a module's class path: 'sentence_transformers.models.Dense' -> 'Dense'."""
    return module_type.rsplit(".", 1)[-1]


def read_st_config(folder: str) -> STConfig:
    """Parse the sentence-transformers files of a local folder; unknown module types are refused."""
    config = STConfig()
    modules = _read_json(os.path.join(folder, "modules.json"))
    if modules:
        config.present = True
        for module in sorted(_entries(folder, modules), key=lambda m: m.get("idx", 0)):
            kind, path = _kind(module["type"]), module.get("path", "")
            _check_module_files(folder, kind, path)
            if kind in ("Transformer", "MLMTransformer"):  # MLMTransformer: a SparseEncoder's masked LM
                config.transformer_path = path
            elif kind == "SpladePooling":
                config.splade = _read_json(os.path.join(folder, path, "config.json")) or {}
            elif kind == "Pooling":
                config.pooling = _read_json(os.path.join(folder, path, "config.json")) or {}
            elif kind == "Dense":
                config.dense_paths.append(path)
            elif kind == "Normalize":
                config.normalize = True
            else:
                raise StartupError(f"model folder {folder}: sentence-transformers module {module['type']!r} cannot be "
                                   "served; supported are Transformer, Pooling, Dense and Normalize (and a "
                                   "SparseEncoder's MLMTransformer and SpladePooling)")
    bert = _read_json(os.path.join(folder, config.transformer_path, "sentence_bert_config.json")) or {}
    config.max_seq_length = bert.get("max_seq_length")
    config.do_lower_case = bool(bert.get("do_lower_case", False))
    config.modality_config = bert.get("modality_config")
    config.processing_kwargs = bert.get("processing_kwargs") or {}
    _refuse_unserved(folder, bert)
    st = _read_json(os.path.join(folder, "config_sentence_transformers.json")) or {}
    config.prompts = {k: v for k, v in (st.get("prompts") or {}).items() if v is not None}
    config.default_prompt_name = st.get("default_prompt_name")
    return config


def _entries(folder: str, modules) -> list[dict]:
    """modules.json's entries, each with a `type`; anything else is refused."""
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise StartupError(f"model folder {folder}: modules.json is not a list of modules each with a `type` "
                           "(as sentence-transformers writes it); restore it")
    return modules


# The files each module reads from its folder (sentence-transformers' own loaders fail without them; a module
# folder git never stored, as Normalize's, is fine: it has no files)
_MODULE_FILES = {
    "Transformer": ("config.json",), "MLMTransformer": ("config.json",), "Pooling": ("config.json",),
    "SpladePooling": ("config.json",), "Dense": ("config.json",),
}
_DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def _check_module_files(folder: str, kind: str, path: str) -> None:
    """A module modules.json names has its files: a missing Pooling config would otherwise pool by a default,
    a Dense without weights fail as an unnamed file."""
    where = os.path.join(folder, path)
    named = f"modules.json names a {kind} module at '{path or '.'}'"
    if path and not os.path.isdir(where) and kind in _MODULE_FILES:
        raise StartupError(f"model folder {folder}: {named}, which is not there; restore the module's "
                           "folder or remove it from modules.json")
    for name in _MODULE_FILES.get(kind, ()):
        if not os.path.isfile(os.path.join(where, name)):
            raise StartupError(f"model folder {folder}: {named} without its {name}; restore the module's files")
    if kind == "Dense" and not any(os.path.isfile(os.path.join(where, name)) for name in _DENSE_WEIGHTS):
        raise StartupError(f"model folder {folder}: {named} without its weights ({' or '.join(_DENSE_WEIGHTS)}); "
                           "restore the module's files")


# What the worker's tokenising does not do (it tokenises to the max length, renders `message` with the template
# kwargs of plaintext.py): a folder that asks for more is refused rather than served with other vectors.
_HONOURED_PROCESSING = {"chat_template"}
_OUTPUTS = {"last_hidden_state", "token_embeddings", "logits"}  # logits: a SparseEncoder's MLM


def _refuse_unserved(folder: str, bert: dict) -> None:
    """sentence_bert_config.json settings the worker cannot reproduce, refused in one line."""
    def refuse(what: str) -> None:
        raise StartupError(f"model folder {folder}: {what} in sentence_bert_config.json is not served exactly "
                           "by embedfleet; serve it with sentence-transformers")
    extra = set(bert.get("processing_kwargs") or {}) - _HONOURED_PROCESSING
    if extra:
        refuse(f"processing_kwargs {sorted(extra)}")
    for key in ("query_expansion", "query_length", "document_length"):
        if bert.get(key) is not None:
            refuse(f"{key} (a multi-vector encoder's query handling)")
    modalities = bert.get("modality_config")
    if modalities is not None:
        if not {"text", "message"} & set(modalities):
            refuse(f"modality_config {sorted(modalities)} (no text input)")
        for name in {"text", "message"} & set(modalities):
            entry = modalities[name] or {}
            if entry.get("method", "forward") != "forward" or entry.get("method_output_name") not in _OUTPUTS:
                refuse(f"modality_config {name!r} entry {entry}")
