"""Plain strings on a chat-template folder, as sentence-transformers 6 encodes them.

sentence-transformers 6 saves a `modality_config` in sentence_bert_config.json; when it has a `message` entry
(ST writes one for a tokenizer with a chat template), `encode("text")` renders every plain string as one user
message through the tokenizer's chat template (a prompt becomes a system message in front of it) and tokenises
the rendered text without adding special tokens; when truncation cut a row, the template's tail (its suffix
tokens) is written back over the row's last tokens. Folders saved without that entry stay text-only.
Read in sentence_transformers/base/modules/transformer.py (preprocess, _process_chat_messages,
_restore_chat_template_suffix) and base/modality.py (InputFormatter: flat vs structured content).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embedfleet.common.errors import StartupError, ValidationError

# InputFormatter's model types whose templates want flat content, and the template fragments that mean
# structured content (a list of {"type": "text", "text": ...} parts).
_FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "minicpm3", "seed_oss")
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
_SIZE_KWARGS = frozenset({"padding", "truncation", "max_length", "return_tensors"})  # tokenising, not rendering


@dataclass(frozen=True)
class MessageText:
    """How a folder's plain strings become a conversation: the content layout and the template's kwargs."""

    content_format: str  # "flat": content is the string; "structured": [{"type": "text", "text": string}]
    template_kwargs: dict = field(default_factory=dict)  # processing_kwargs["chat_template"], for rendering
    restore_suffix: bool = True  # ST's restore_suffix: a truncated row gets the template's tail back


def message_text(folder: str, modality_config: dict | None, processing_kwargs: dict, tokenizer,
                 model_type: str) -> MessageText | None:
    """The folder's plain-text handling: None (tokenise the string as is) unless its saved modality_config has a
    `message` entry. A `message` entry on a tokenizer without a chat template cannot be rendered: refused."""
    if not modality_config or "message" not in modality_config:
        return None
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise StartupError(f"model folder {folder}: its modality_config renders text as chat messages but its "
                           "tokenizer has no chat template; add the template (chat_template.jinja) or remove "
                           "the `message` entry")
    if not isinstance(template, str):
        raise StartupError(f"model folder {folder}: its tokenizer has several named chat templates; "
                           "sentence-transformers' plain-text rendering is served for a single template only")
    layout = modality_config["message"].get("format", "auto")
    if layout == "auto":
        layout = _infer_format(template, model_type)
    if layout not in ("flat", "structured"):
        raise StartupError(f"model folder {folder}: modality_config message format {layout!r} is unknown "
                           "(flat, structured or auto)")
    kwargs = dict((processing_kwargs or {}).get("chat_template") or {})
    restore = bool(kwargs.pop("restore_suffix", True))
    return MessageText(layout, {k: v for k, v in kwargs.items() if k not in _SIZE_KWARGS}, restore)


def _infer_format(template: str, model_type: str) -> str:
    """InputFormatter._infer_format: known model types, then the template's own way of reading content."""
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    return "structured" if any(p in template for p in _STRUCTURED_PATTERNS) else "flat"


def conversation(spec: MessageText, text: str, prompt: str | None) -> list[dict]:
    """One plain string as ST's conversation: [system prompt,] user text."""
    def message(role: str, content: str) -> dict:
        return {"role": role, "content": content if spec.content_format == "flat"
                else [{"type": "text", "text": content}]}
    return ([message("system", prompt)] if prompt else []) + [message("user", text)]


def render_ids(tokenizer, spec: MessageText, texts: list[str], prompt: str | None) -> list[list[int]]:
    """Each string rendered through the template and tokenised without added special tokens (the template
    writes its own), untruncated: the caller judges the length."""
    try:
        # one call for the whole list: transformers renders each conversation, the per-call set-up once
        rendered = tokenizer.apply_chat_template([conversation(spec, text, prompt) for text in texts],
                                                 tokenize=False, **spec.template_kwargs)
    except Exception as exc:  # Jinja and transformers raise many kinds for a template that refuses an input
        raise ValidationError(f"the model's chat template cannot render this input as a user message (the "
                              f"folder renders plain text through it): {type(exc).__name__}: {exc}",
                              param="input") from exc
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def suffix_ids(tokenizer, spec: MessageText, prompt: str | None) -> list[int]:
    """The template's tail after the content (ST's _chat_template_suffix_ids): the longest common token suffix
    of two renders with different fillers; [] where the renders never diverge."""
    first, second = (render_ids(tokenizer, spec, [filler], prompt)[0] for filler in ("0", "1 2 3 4"))
    count = 0
    for left, right in zip(reversed(first), reversed(second)):
        if left != right:
            break
        count += 1
    return list(first[len(first) - count:]) if 0 < count < min(len(first), len(second)) else []


def truncate(ids: list[int], keep: int, side: str, suffix: list[int]) -> list[int]:
    """A rendered row cut to `keep` tokens, the template's suffix written back over its end (ST restores it
    on every row that reached the max length; on a left cut the tail is already there)."""
    if len(ids) <= keep:
        return list(ids)
    if side == "left":
        return list(ids[-keep:])
    cut = list(ids[:keep])
    tail = min(len(suffix), keep)
    if tail:
        cut[keep - tail:] = suffix[len(suffix) - tail:]
    return cut
