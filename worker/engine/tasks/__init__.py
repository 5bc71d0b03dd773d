"""The request kinds beyond `embed`: their tokenising, model heads and answers (see common.params.Task)."""
