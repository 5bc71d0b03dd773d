"""text-embeddings-inference's API: /embed, /embed_all, /embed_sparse, /similarity, /info, ... (routes), their
request bodies (schemas), and which model a TEI route serves, /tei/<model>/ (paths)."""
