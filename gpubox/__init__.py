"""gpubox: see every GPU on one box, feed it, queue work onto it, account for its hours."""

__version__ = "0.1.0"
