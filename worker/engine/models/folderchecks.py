"""What a loaded model folder must show before it serves, each refused in one line that names the folder and what
is wrong (a leaf: it imports no other module of worker/engine/models).

A folder can be quietly wrong and still load: transformers builds a tokenizer with an empty vocabulary when the
folder has no tokenizer files (every word then reads as [UNK]: unrelated texts at cosine 0.99), fills weights a
checkpoint lacks with random values, and a tokenizer of another model gives ids past the embedding matrix. The
fidelity check cannot see any of this (it compares the model with itself), so these checks run first.
"""

from __future__ import annotations

import os

from torch import nn

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.fidelity import PROBE_TEXTS

# Most of the probe texts' tokens read as the unknown token: the vocabulary is not the model's. Measured on the
# probe texts (worker/engine/fidelity.py): all-MiniLM-L6-v2 0 of 93, the tests' tiny vocabularies (166-400
# tokens) 0-4%, a folder without its tokenizer files 100%.
MAX_UNKNOWN_SHARE = 0.5
# A model's own tokenizer fills its embedding matrix but for padding rows (Qwen2.5 151,665 of 151,936, T5 32,100 of
# 32,128, DeBERTa-v3 128,001 of 128,100): one that fills less than 1/MIN_VOCABULARY_SHARE is another model's.
MIN_VOCABULARY_SHARE = 2
# Files that configure a tokenizer but hold no vocabulary (a class that lists only these needs none: ByT5, Canine)
_NOT_VOCABULARY = {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"}


def check_tokenizer(folder: str, model_dir: str, tokenizer) -> None:
    """The tokenizer is the folder's own and reads the probe texts mostly as known tokens."""
    needed = set((getattr(type(tokenizer), "vocab_files_names", None) or {}).values()) - _NOT_VOCABULARY
    if needed and not any(os.path.isfile(os.path.join(model_dir, name)) for name in needed | {"tokenizer.json"}):
        where = os.path.relpath(model_dir, folder)
        raise StartupError(f"model folder {folder}: no tokenizer files{'' if where == '.' else ' in ' + where} (one of "
                           f"{', '.join(sorted(needed | {'tokenizer.json'}))} is needed; without them transformers "
                           f"builds an empty {type(tokenizer).__name__} that reads every word as unknown): copy "
                           "the model's tokenizer files into the folder")
    unknown = tokenizer.unk_token_id
    if unknown is None:  # byte-level: no text is unknown
        return
    rows = tokenizer(list(PROBE_TEXTS), add_special_tokens=False, verbose=False)["input_ids"]
    ids = [token for row in rows for token in row]
    share = sum(token == unknown for token in ids) / max(1, len(ids))
    if share > MAX_UNKNOWN_SHARE:
        raise StartupError(f"model folder {folder}: its tokenizer reads {share:.0%} of the probe texts' {len(ids)} "
                           f"tokens as the unknown token {tokenizer.unk_token!r} (at most {MAX_UNKNOWN_SHARE:.0%} is "
                           "allowed; a model's own reads few or none so, all-MiniLM-L6-v2's 0%): its vocabulary is "
                           "not this model's; restore the model's tokenizer files")


def check_weights(folder: str, module: nn.Module, loading_info: dict) -> None:
    """Every weight the forward pass uses came from the checkpoint, none randomly initialised."""
    missing = sorted(loading_info.get("missing_keys") or ())
    if not type(module).__name__.endswith("ForSequenceClassification"):
        # a base model's pooler head is not part of last_hidden_state (sentence-transformers loads it missing too)
        missing = [key for key in missing if not key.startswith("pooler.")]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise StartupError(f"model folder {folder}: its checkpoint lacks {len(missing)} weight"
                           f"{'s' * (len(missing) != 1)} of the model ({shown}), which transformers would fill with "
                           "random values: restore the model's weights file (an incomplete download, or weights of "
                           "another architecture)")


def check_vocabulary(folder: str, tokenizer, module: nn.Module) -> None:
    """The tokenizer's ids fit the embedding matrix: none past it (they fail on a CPU and abort the CUDA context
    on a GPU), and not a vocabulary far smaller than it (another model's: its ids name other tokens)."""
    try:
        rows = module.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):  # a model without a token embedding table: nothing to check
        return
    vocabulary = tokenizer.get_vocab()
    largest = max(vocabulary.values(), default=-1)
    if largest >= rows:
        raise StartupError(f"model folder {folder}: its tokenizer gives token ids up to {largest} but the model's "
                           f"embedding matrix has {rows} rows (ids 0-{rows - 1}): the tokenizer is not this model's; "
                           "restore the model's own tokenizer files")
    if len(vocabulary) * MIN_VOCABULARY_SHARE < rows:
        raise StartupError(f"model folder {folder}: its tokenizer has {len(vocabulary)} tokens but the model's "
                           f"embedding matrix has {rows} rows (a model's own tokenizer fills at least "
                           f"1/{MIN_VOCABULARY_SHARE} of them; the rest is padding): the tokenizer is not this "
                           "model's; restore the model's own tokenizer files")


def position_limit(module: nn.Module) -> int | None:
    """The tokens an absolute position table holds (a RoBERTa-style one starts after its padding index); None:
    rotary or relative positions, no table to run past."""
    table = next((sub for name, sub in module.named_modules()
                  if name.rsplit(".", 1)[-1] in ("position_embeddings", "wpe") and isinstance(sub, nn.Embedding)),
                 None)
    if table is None:
        return None
    return table.num_embeddings - (table.padding_idx + 1 if table.padding_idx is not None else 0)


def check_positions(folder: str, module: nn.Module, max_model_len: int) -> None:
    """The position table holds the max length requests are allowed: sentence_bert_config.json's max_seq_length
    may claim more (models/base.py max_len takes it as given), and every longer input would fail in the pass."""
    usable = position_limit(module)
    if usable is not None and max_model_len > usable:
        raise StartupError(f"model folder {folder}: max length {max_model_len} (max_seq_length in "
                           f"sentence_bert_config.json) is more than the model's {usable} positions: set "
                           f"max_seq_length to at most {usable}")
