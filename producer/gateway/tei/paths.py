"""Which model a TEI route serves. TEI serves one model per server, so its clients (huggingface_hub's
`InferenceClient(model=url)`, TEI's own SDKs) never name one; a gateway serving several gives each model a TEI
root of its own, `/tei/<model>/` (`/tei/<model>/embed`, `/rerank`, `/info`, ...), and `--tei-model` names the
model of the bare TEI routes. A body's own `model` (our addition) still works, and must agree with the path."""

from __future__ import annotations

from contextvars import ContextVar
from urllib.parse import unquote

from embedfleet.common.errors import ValidationError, echo

PREFIX = "/tei/"
# TEI's routes (router/src/http/server.rs) that answer here; "" is TEI's `POST /`
ROUTES = frozenset({"", "embed", "embed_all", "embed_sparse", "similarity", "info", "rerank", "tokenize", "decode"})
_PATH_MODEL: ContextVar[str | None] = ContextVar("tei_path_model", default=None)


class TeiModelPaths:
    """ASGI middleware: `/tei/<model>/<route>` is answered by `/<route>` for <model>; other paths pass as they are."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            model, _, route = scope["path"][len(PREFIX):].partition("/")
            if model and route in ROUTES:
                path = "/" + route
                token = _PATH_MODEL.set(unquote(model))
                try:
                    await self.app({**scope, "path": path, "raw_path": path.encode()}, receive, send)
                finally:
                    _PATH_MODEL.reset(token)
                return
        await self.app(scope, receive, send)


def tei_model(named: str | None, default: str | None) -> str | None:
    """The model a TEI request is for: the body's `model`, the path's `/tei/<model>/`, else `default` (the
    gateway's --tei-model); None: the only served model (producer.client.core.pick_model)."""
    path = _PATH_MODEL.get()
    if named is not None and path is not None and named != path:
        raise ValidationError(f"the body names model '{echo(named)}' but the path {PREFIX}{echo(path)}/ names "
                              f"'{echo(path)}': name one, or the same", param="model")
    return named or path or default
