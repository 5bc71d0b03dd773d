"""vLLM's task routes, /score, /rerank, /classify, /tokenize, /detokenize, with their Cohere and TEI aliases
(routes), and their request bodies (schemas)."""
