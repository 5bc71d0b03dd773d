"""Cohere's embed API, POST /v2/embed (routes)."""
