"""Model loading: which kind a folder is (loader.py: `load_model`), one module per kind (embedding, bgem3,
splade, classifier, nullmodel) and the pieces they share (base.py). Nothing is imported here, so that
importing one module of the package never runs another (no import loop through this file)."""
