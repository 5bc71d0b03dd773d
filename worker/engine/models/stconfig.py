"""Reading a sentence-transformers folder's config files (modules.json and friends) without importing ST."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


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
        for module in sorted(modules, key=lambda m: m.get("idx", 0)):
            kind, path = _kind(module["type"]), module.get("path", "")
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
                raise ValueError(f"unsupported sentence-transformers module {module['type']!r} in {folder}: "
                                 "supported are Transformer, Pooling, Dense and Normalize (and a SparseEncoder's "
                                 "MLMTransformer and SpladePooling)")
    bert = _read_json(os.path.join(folder, config.transformer_path, "sentence_bert_config.json")) or {}
    config.max_seq_length = bert.get("max_seq_length")
    config.do_lower_case = bool(bert.get("do_lower_case", False))
    st = _read_json(os.path.join(folder, "config_sentence_transformers.json")) or {}
    config.prompts = {k: v for k, v in (st.get("prompts") or {}).items() if v is not None}
    config.default_prompt_name = st.get("default_prompt_name")
    return config
