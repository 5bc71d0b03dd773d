"""Chat `messages` on /v1/embeddings, /pooling and /classify, as vLLM's EmbeddingChatRequest accepts them.

A body with `messages` embeds the conversation as one input: the worker renders it with the model's chat
template (common/chat.py, worker/engine/chat.py). Text content parts are joined with newlines, as vLLM's
"string" content format does; image and audio parts are refused (the fleet serves text models).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from embedfleet.common.bounds import FailFastList
from embedfleet.common.chat import MAX_MESSAGES


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"] = Field(description="`text` only: the fleet embeds text")
    text: str


class Message(BaseModel):
    """OpenAI's chat message, text only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    content: str | FailFastList[TextPart] | None = None
    name: str | None = None

    def plain(self) -> dict:
        """The message as the worker's template sees it: content as one string."""
        content = self.content if not isinstance(self.content, list) else "\n".join(p.text for p in self.content)
        return {"role": self.role, **({"content": content} if content is not None else {}),
                **({"name": self.name} if self.name is not None else {})}


CHAT_ONLY = ("chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")


class ChatFields(BaseModel):
    """The fields of vLLM's chat requests; a body takes either `input` or `messages`."""

    messages: FailFastList[Message] | None = Field(None, min_length=1, max_length=MAX_MESSAGES,
                                                   description="a conversation embedded as one input, rendered "
                                                               "with the model's chat template; instead of `input`")
    chat_template: str | None = Field(None, description="a Jinja template instead of the model's (only on workers "
                                                        "started with --trust-request-chat-template)")
    chat_template_kwargs: dict[str, JsonValue] | None = Field(None, description="extra template variables")
    add_generation_prompt: bool | None = Field(None, description="end with the assistant turn's opening")
    continue_final_message: bool | None = Field(None, description="leave the last message open")

    @model_validator(mode="after")
    def _input_or_messages(self):
        has_input = getattr(self, "input", None) is not None
        if has_input == (self.messages is not None):
            raise ValueError("send either `input` or `messages` (a chat conversation), "
                             + ("not both" if has_input else "one of them"))
        stray = [name for name in CHAT_ONLY if getattr(self, name) is not None]
        if stray and self.messages is None:
            raise ValueError(f"{', '.join(f'`{n}`' for n in stray)} apply to `messages` only; send `messages`, or "
                             "leave them out")
        return self

    def chat_fields(self) -> dict:
        """Producer.submit's keywords for the conversation: `chat`, and vLLM's chat default of no special tokens
        on top of the template's (unless the body set add_special_tokens); empty without `messages`."""
        if self.messages is None:
            return {}
        chat = {"messages": [m.plain() for m in self.messages],
                **self.model_dump(include=set(CHAT_ONLY), exclude_none=True)}
        return {"chat": chat, **({} if getattr(self, "add_special_tokens", None) is not None
                                 else {"add_special_tokens": False})}


def cohere_messages(texts: list[str], prefix: str | None) -> list[Message]:
    """A Cohere `inputs` entry as vLLM renders it: one user message of its text parts, each after the
    input_type's prompt."""
    return [Message(role="user", content=[TextPart(type="text", text=(prefix or "") + t) for t in texts])]
