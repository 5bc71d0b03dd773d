"""The model side of embedfleet: loading, tokenising, batching, forward pass, pooling and output casting."""
