"""Model quality benchmarks: INT8 speed and accuracy (see int8.py)."""
