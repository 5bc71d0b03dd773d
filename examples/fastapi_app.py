"""A web app that enqueues embedding requests on the fleet and awaits them (docs/python.md: "Waiting at scale").

    pip install 'embedfleet[gateway]'   # the fleet's client plus FastAPI and uvicorn
    EMBEDFLEET_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app --port 8080
    curl -s localhost:8080/embed -H 'content-type: application/json' -d '{"texts": ["hello", "world"]}'

One AsyncProducer per process: however many requests wait at once, it holds at most four Redis
connections, and each wait costs no round trip of its own.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from embedfleet.common.errors import EmbedfleetError
from embedfleet import AsyncProducer
from embedfleet.producer.gateway.core.errors import error_body, status_of


@asynccontextmanager
async def lifespan(app: FastAPI):
    # Made inside the server's event loop (its connections belong to it); the URL comes from
    # EMBEDFLEET_REDIS_URL, else a running `embedfleet up`, else redis://127.0.0.1:6379/0.
    async with AsyncProducer() as producer:
        app.state.producer = producer
        yield


app = FastAPI(lifespan=lifespan)


class Texts(BaseModel):
    texts: list[str] = Field(min_length=1)
    model: str | None = None  # None: the fleet's only model


@app.post("/embed")
async def embed(body: Texts, request: Request) -> dict:
    """One request for all the texts, awaited: the vectors in order."""
    vectors = await request.app.state.producer.embed(body.texts, body.model, timeout=30)
    return {"embeddings": vectors.tolist()}


@app.post("/embed-each")
async def embed_each(body: Texts, request: Request) -> dict:
    """One request per text, consumed as each lands (as_completed), so that one slow or failed text does
    not hold up or fail the others."""
    producer: AsyncProducer = request.app.state.producer
    ids = await producer.submit_many([[text] for text in body.texts], body.model)
    position = {request_id: i for i, request_id in enumerate(ids)}
    answers: list = [None] * len(ids)
    async for result in producer.as_completed(ids, timeout=60):
        answers[position[result.id]] = result.embeddings[0].tolist() if result.ok else {"error": result.error_code}
    return {"embeddings": answers}


@app.exception_handler(EmbedfleetError)
async def fleet_error(request: Request, err: EmbedfleetError) -> JSONResponse:
    """The fleet's errors with the gateway's status table: 400 for a bad request, 503 with no worker, ..."""
    return JSONResponse(error_body(err), status_code=status_of(err.code))
