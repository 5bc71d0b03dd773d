"""The model side of a worker, with no Redis: load a model, prepare (verify, tokenise), forward passes
cut by a token budget, pooling and heads, postprocess (cut, normalise, cast)."""
