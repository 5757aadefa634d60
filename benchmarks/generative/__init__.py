"""Generative serving benchmarks: the agent's OpenAI endpoint against a raw ONNX Runtime loop,
onnxruntime-genai's engine and llama.cpp's server, on the larger example LM (README.md here)."""
