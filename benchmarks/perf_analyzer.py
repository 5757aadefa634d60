"""Triton's own load generator, ``perf_analyzer``, fetched where Triton ships it: the
``tritonclient`` wheels up to 2.52 carry the binary (later ones leave it to NVIDIA's SDK
container); 2.51 is the last built on glibc 2.35, which Debian 12 (2.36) runs. It needs two
shared libraries and no GPU: ``libb64.so.0d`` (Debian's ``libb64-0d``) and ``libcudart.so.12``
(PyPI's ``nvidia-cuda-runtime-cu12``, which loads without a device).

    python3 -m benchmarks.perf_analyzer .tools/perf_analyzer

writes ``perf_analyzer`` there: a wrapper that runs the binary with its libraries found. Used by
``.ci/run`` for ``tests/agent/grpc/test_perf_analyzer.py`` and by the benchmark table in
docs/benchmarks.md; it only needs the standard library and pip.
"""

from __future__ import annotations

import argparse
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

TRITONCLIENT = "tritonclient==2.51.0"
CUDA_RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
BINARY = "tritonclient-2.51.0.data/data/bin/perf_analyzer"
CUDART = "nvidia/cuda_runtime/lib/libcudart.so.12"


def fetch(dest: Path) -> Path:
    """Download the two wheels, unpack the binary and libcudart into ``dest``, and write the
    wrapper ``dest/perf_analyzer``; returns the wrapper."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp]
            + [TRITONCLIENT, CUDA_RUNTIME],
            check=True,
        )
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                for member, name in ((BINARY, "perf_analyzer.bin"), (CUDART, "libcudart.so.12")):
                    if member in archive.namelist():
                        (dest / name).write_bytes(archive.read(member))
    binary = dest / "perf_analyzer.bin"
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    wrapper = dest / "perf_analyzer"
    wrapper.write_text(
        '#!/bin/sh\nhere="$(dirname "$(readlink -f "$0")")"\n'
        'LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" '
        'exec "$here/perf_analyzer.bin" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to write perf_analyzer into")
    print(fetch(parser.parse_args().dest))


if __name__ == "__main__":
    main()
