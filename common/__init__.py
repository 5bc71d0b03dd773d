"""The contract between producers and workers: wire models, codecs, errors, key layout (no torch here)."""
