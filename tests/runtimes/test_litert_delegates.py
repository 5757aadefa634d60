"""LiteRT delegate libraries: which ones the inventory counts as usable, and what loading one
that is not a working delegate raises."""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
from pathlib import Path

import pytest

from runtimes.backends import open_model
from runtimes.base import Placement
from runtimes.errors import DeviceUnavailableError
from runtimes.inventory import probe_runtimes

# A LiteRT external delegate plugin that refuses to create a delegate and reports, through
# LiteRT's error callback, the option keys it was given.
REFUSING_DELEGATE = r"""
#include <stddef.h>
#include <string.h>

void *tflite_plugin_create_delegate(char **keys, char **values, size_t count,
                                    void (*report)(const char *)) {
    char message[512] = "refused; options:";
    (void)values;
    for (size_t i = 0; i < count; i++) {
        strncat(message, " ", sizeof message - strlen(message) - 1);
        strncat(message, keys[i], sizeof message - strlen(message) - 1);
    }
    report(message);
    return NULL;
}

void tflite_plugin_destroy_delegate(void *delegate) { (void)delegate; }
"""


@pytest.fixture(scope="module")
def refusing_delegate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in delegate")
    directory = tmp_path_factory.mktemp("delegate")
    source = directory / "refusing_delegate.c"
    source.write_text(REFUSING_DELEGATE)
    library = directory / "librefusing_delegate.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=60
    )
    return library


def _libm() -> str:
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a library that is not a delegate")
    return libm


def test_only_delegate_libraries_that_load_by_their_name_are_usable(tmp_path: Path) -> None:
    """A name the dynamic loader cannot open is unusable even when find_library() finds
    another library of that stem (libm.so.99 -> libm.so.6): LiteRT opens the name given."""
    libm = _libm()
    corrupt = tmp_path / "libedgetpu.so.1"
    corrupt.write_bytes(b"\x7fELF truncated")
    inventory = probe_runtimes(
        delegates=(libm, "libm.so.99", str(corrupt), "libedgetpu-absent.so.1"), root=tmp_path
    )
    assert inventory.delegate_libraries == {libm}


def test_library_that_is_not_a_delegate_is_device_unavailable(example_repo: Path) -> None:
    libm = _libm()
    placement = Placement(runtime="litert", device="GPU", delegate=libm)
    with pytest.raises(DeviceUnavailableError) as info:
        open_model(example_repo / "mlp_tflite/1/model.tflite", placement)
    message = str(info.value)
    assert message.startswith(f"litert GPU: cannot load delegate {libm}: not a LiteRT delegate")
    assert "tflite_plugin_create_delegate" in message
    assert info.value.code == "device_unavailable"


def test_refused_delegate_is_device_unavailable_and_sees_only_its_own_options(
    example_repo: Path, refusing_delegate: Path
) -> None:
    assert probe_runtimes(
        delegates=(str(refusing_delegate),), root=refusing_delegate.parent
    ).delegate_libraries == {str(refusing_delegate)}
    placement = Placement(
        runtime="litert",
        device="GPU",
        delegate=str(refusing_delegate),
        options={"xnnpack": False, "precision_loss_allowed": 1},
    )
    with pytest.raises(DeviceUnavailableError) as info:
        open_model(example_repo / "mlp_tflite/1/model.tflite", placement)
    message = str(info.value)
    assert message.startswith(f"litert GPU: cannot load delegate {refusing_delegate}: ")
    # The backend's own xnnpack key is not passed on to the delegate.
    assert message.endswith("refused; options: precision_loss_allowed"), message
