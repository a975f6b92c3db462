"""One module per parallelism (tensor, data, pipeline, checkpoint, relayout), each an apply_* step."""
