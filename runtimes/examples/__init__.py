"""Example models made by the project itself: deterministic, small, no downloads.

``write_example_repository(DIR)`` writes ``mlp`` (ONNX), ``cnn`` (ONNX, MobileNetV2-like),
``cnn_ir`` (the same CNN as OpenVINO IR) and ``mlp_tflite`` (the same MLP as a ``.tflite``
flatbuffer), each with a golden input and the expected output computed by a numpy reference,
and ``classifier``, a pipeline around the CNN that takes JPEG bytes and gives top-5 labels.
"""

from runtimes.examples.repository import EXAMPLE_MODELS, write_example_repository

__all__ = ["EXAMPLE_MODELS", "write_example_repository"]
