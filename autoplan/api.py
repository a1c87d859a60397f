"""The public API (filled in as the stages land)."""
def solve(*a, **k): raise NotImplementedError
def estimate(*a, **k): raise NotImplementedError
def load_model(*a, **k): raise NotImplementedError
def load_cluster(*a, **k): raise NotImplementedError
