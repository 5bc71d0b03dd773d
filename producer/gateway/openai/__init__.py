"""OpenAI's embeddings API, POST /v1/embeddings (routes); its body is the gateway's own (core/schemas.py)."""
