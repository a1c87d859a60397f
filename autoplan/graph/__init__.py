"""Model graphs: tracing model.py on the meta device into a LayerGraph."""
