"""Chat input: a conversation embedded as one input, rendered by the worker with the model's chat template.

vLLM's EmbeddingChatRequest (and its pooling / classify twins) take `messages` instead of `input`; the text
embedded is `tokenizer.apply_chat_template(messages, tokenize=False, ...)`. The gateway holds no tokenizer,
so a request carries the conversation and the template options (`EmbedRequest.chat`) and the worker renders
it, then tokenises the text as it does any input. Its `inputs` hold one CHAT_INPUT placeholder.

What a worker reads from Redis is input: every field here is bounded and checked again on decode.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from embedfleet.common.codec import check_text

CHAT_INPUT = "<chat messages, rendered by the worker>"  # `inputs` of a chat request: one conversation
MAX_MESSAGES = 4096
MAX_ROLE_CHARS = 64
# apply_chat_template's own parameters, and the names it passes to the template itself: a kwarg of the same
# name would collide with them (a TypeError in the worker), so they are refused where the request is built.
RESERVED_KWARGS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token",
    "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens"})
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
               "template if the tokenizer does not define one.")  # vLLM's words for a model without one
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")  # vLLM's words


class ChatMessage(BaseModel):
    """One message: a role and its text (content parts are joined by the gateway, as vLLM's string format)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str = Field(min_length=1, max_length=MAX_ROLE_CHARS)
    content: str | None = None
    name: str | None = Field(None, max_length=MAX_ROLE_CHARS)

    @field_validator("role", "content", "name")
    @classmethod
    def _unicode(cls, value):
        return check_text(value)  # msgpack carries UTF-8 only


class ChatInput(BaseModel):
    """A conversation and vLLM's template options; `chat_template` None: the model's own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    chat_template: str | None = Field(None, min_length=1)
    chat_template_kwargs: dict[str, JsonValue] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False

    @field_validator("chat_template")
    @classmethod
    def _template_text(cls, value):
        return check_text(value)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs(cls, value: dict[str, Any] | None):
        if value:
            taken = sorted(set(value) & RESERVED_KWARGS)
            if taken:
                raise ValueError(f"`chat_template_kwargs` may not set {taken}: these are the request's own fields "
                                 "or the tokenizer's special tokens; send the fields themselves")
            odd = [k for k in value if not k.isidentifier()]
            if odd:
                raise ValueError(f"`chat_template_kwargs` keys must be template variable names, got {odd[0]!r}")
            check_text(value)
        return value

    @model_validator(mode="after")
    def _one_ending(self):
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return self

    def render_kwargs(self) -> dict:
        """The keywords of `apply_chat_template(..., tokenize=False)` besides the conversation."""
        return {"chat_template": self.chat_template, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, **(self.chat_template_kwargs or {})}

    def conversation(self) -> list[dict]:
        return [message.model_dump(exclude_none=True) for message in self.messages]


ChatTask = Literal["embed", "classify", "token_embed"]
CHAT_TASKS: tuple[str, ...] = ChatTask.__args__
