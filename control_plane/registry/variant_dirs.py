"""A variant directory on the operator's side, as ``models push`` and the console's upload
read it: its format and its files in upload order. The model file (a generative model's
``genai_config.json``) goes last, so the variant is complete once it is in."""

from __future__ import annotations

from pathlib import Path

from common.pipeline_config import PIPELINE_FILES
from runtimes.formats import GENAI_CONFIG, GENAI_FORMAT, find_model_file

VERSION_SAMPLES = frozenset({"golden.npz", "validation.npz", "reference.npz"})
"""A version's own files, uploaded to their own routes, never as a variant's."""


def variant_files(directory: Path) -> tuple[str, list[Path]]:
    """``(format, files)`` of ``directory``.

    Raises:
        ModelFileError: no model file, or more than one, named in the message.
        OSError: the directory cannot be read.
    """
    if (directory / GENAI_CONFIG).is_file():
        files = sorted(
            f for f in directory.iterdir() if f.is_file() and f.name not in VERSION_SAMPLES
        )
        return GENAI_FORMAT, [f for f in files if f.name != GENAI_CONFIG] + [
            directory / GENAI_CONFIG
        ]
    model_file, fmt = find_model_file(directory)
    # a pipeline's files first: the model file completes the variant
    files = sorted(f for f in directory.iterdir() if PIPELINE_FILES.match(f.name))
    files += [model_file] + ([model_file.with_suffix(".bin")] if fmt.value == "openvino_ir" else [])
    return fmt.value, files
