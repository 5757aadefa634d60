"""``python -m benchmarks``: the whole suite (see :mod:`benchmarks.run`)."""

from benchmarks.run import bench

bench(prog_name="python -m benchmarks")
