"""Model loading (moved whole from worker/engine; split into one module per kind next)."""
