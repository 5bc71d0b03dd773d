"""vLLM's pooling API, POST /pooling (routes), and its body (schemas)."""
