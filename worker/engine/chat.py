"""Chat input on the worker: a request's conversation -> the text it embeds, rendered with the tokenizer's
chat template exactly as `tokenizer.apply_chat_template(messages, tokenize=False, ...)` renders it (in
transformers' sandboxed Jinja environment); then it is tokenised like any text input."""

from __future__ import annotations

from embedfleet.common.chat import ChatInput
from embedfleet.common.errors import ValidationError


def render(tokenizer, chat: ChatInput) -> str:
    """The conversation as text; a template that fails on it (raise_exception, a missing key, ...) is the
    request's error, not the worker's."""
    try:
        text = tokenizer.apply_chat_template(chat.conversation(), tokenize=False, **chat.render_kwargs())
    except Exception as exc:  # Jinja and transformers raise many kinds for a bad template or conversation
        raise ValidationError(f"the chat template cannot render these `messages`: {type(exc).__name__}: {exc}",
                              param="messages") from exc
    if not isinstance(text, str) or not text:
        raise ValidationError("the chat template rendered these `messages` as no text; send other messages or "
                              "another `chat_template`", param="messages")
    return text


def chat_caps(tokenizer, trust_request_chat_template: bool) -> dict:
    """The ModelCapabilities fields of chat input for a model with this tokenizer."""
    return {"has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "trust_request_chat_template": trust_request_chat_template}
