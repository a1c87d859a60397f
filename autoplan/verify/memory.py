"""Memory of a verification run: measured per rank, and predicted by autoplan's memory model."""

from __future__ import annotations


class PeakMemory:
    """Peak bytes of live CPU tensors while the block runs, counted from the rank's model.

    Placeholder: filled in below.
    """

    def __init__(self, rank_model) -> None:
        self.rank_model = rank_model
        self.peak_bytes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
