"""langchain-openai's OpenAIEmbeddings, unchanged, on the gateway's /v1/embeddings (a live gateway with an API
key and a worker thread serving all-MiniLM-L6-v2): vectors equal sentence-transformers', and nothing is
downloaded (with check_embedding_ctx_length=False it never loads a tiktoken encoding)."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from sentence_transformers import SentenceTransformer

from tests.livegateway import forbid_internet, live_gateway

MODEL = "minilm"
KEY = "test-key"
TEXTS = ["The cat sits on the mat.", "A fleet of workers embeds text.", "Redis keeps the queue safe.",
         "Langchain splits documents into chunks.", "Each chunk becomes one vector."]


@pytest.fixture(scope="module")
def gateway_url(redis_server, minilm_engine):
    with live_gateway(redis_server.url, [minilm_engine], api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def st(minilm_path) -> SentenceTransformer:
    return SentenceTransformer(minilm_path, device="cpu")


@pytest.fixture
def offline(monkeypatch) -> list:
    return forbid_internet(monkeypatch)


def embeddings(url: str, **options) -> OpenAIEmbeddings:
    # check_embedding_ctx_length=False: send the texts; True would count tokens with tiktoken's OpenAI encoding
    # (downloaded from the internet) and send token ids cut for OpenAI's models, not ours
    return OpenAIEmbeddings(base_url=f"{url}/v1", api_key=KEY, model=MODEL, check_embedding_ctx_length=False,
                            **options)


def assert_same(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert np.all(cos > 1 - 1e-5), cos
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_embed_documents_and_query_equal_sentence_transformers(gateway_url, st, offline):
    client = embeddings(gateway_url, chunk_size=2)  # three requests of 2, 2 and 1 texts, answered in order
    assert_same(client.embed_documents(TEXTS), st.encode(TEXTS))
    assert_same(client.embed_query(TEXTS[0]), st.encode(TEXTS[0]))
    assert offline == []  # no tiktoken download, no LangSmith, nothing but the gateway


def test_async_embed_documents_and_query(gateway_url, st, offline):
    client = embeddings(gateway_url)

    async def both():
        return await client.aembed_documents(TEXTS), await client.aembed_query(TEXTS[1])

    documents, query = asyncio.run(both())
    assert_same(documents, st.encode(TEXTS))
    assert_same(query, st.encode(TEXTS[1]))
    assert offline == []


def test_a_wrong_key_and_a_wrong_model_raise_openais_errors(gateway_url, offline):
    with pytest.raises(openai.AuthenticationError):
        OpenAIEmbeddings(base_url=f"{gateway_url}/v1", api_key="wrong", model=MODEL,
                         check_embedding_ctx_length=False, max_retries=0).embed_query("hello")
    with pytest.raises(openai.NotFoundError, match="model 'text-embedding-3-small' is not served"):
        OpenAIEmbeddings(base_url=f"{gateway_url}/v1", api_key=KEY, model="text-embedding-3-small",
                         check_embedding_ctx_length=False, max_retries=0).embed_query("hello")
    assert offline == []
