"""The engine's three steps, one module each, that Engine (worker/engine/engine.py) puts together: prepare (verify,
tokenise), forward (the passes) and finish (cut, normalise, cast). Nothing is imported here, so that importing one
step never runs another."""
