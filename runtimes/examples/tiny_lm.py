"""``tiny-lm``: a deterministic causal decoder with a KV cache, as an ONNX Runtime GenAI folder.

Built with the ``onnx`` helper API from a fixed seed, plain opset-17 ops only (what every ONNX
Runtime runs): token + position embeddings (``Gather``), pre-LayerNorm blocks of attention
(past/present KV ``Concat``, an additive mask from ``attention_mask`` and a causal ``Trilu``
offset by the past length) and a SiLU MLP, then logits. Inputs ``input_ids``,
``attention_mask``, ``position_ids`` and ``past_key_values.N.key/value``; outputs ``logits`` and
``present.N.key/value``, KV as ``[batch, kv_heads, seq, head_size]``: the layout
``onnxruntime-genai`` loads (``genai_config.json`` beside it).

Random weights give gibberish, so the logits carry a bias that keeps greedy decoding on
printable ASCII tokens and away from the end-of-text token, which sampling can still reach.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtimes.examples.onnx_models import IR_VERSION, OPSET
from runtimes.examples.tiny_tokenizer import EOS, printable_token_ids
from runtimes.examples.weights import SEED
from runtimes.golden import GOLDEN_FILE, GoldenSample

MODEL_FILE = "model.onnx"
SUPPRESSED_LOGIT = -1.0e4
"""Added to the logits of control, non-ASCII and special tokens: never chosen."""
EOS_LOGIT = -8.0
"""Added to the end-of-text logit: greedy decoding avoids it, sampling may reach it."""


class LmSize(StrEnum):
    TINY = "tiny"
    """About 0.6 M parameters (2.5 MB): the suite's model."""
    BENCH = "bench"
    """About 26 M parameters (100 MB), memory-bound like real edge models: for benchmarks."""


@dataclass(frozen=True)
class LmShape:
    vocab: int
    hidden: int
    heads: int
    layers: int
    mlp: int
    context: int

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    LmSize.TINY: LmShape(vocab=512, hidden=128, heads=4, layers=2, mlp=512, context=256),
    LmSize.BENCH: LmShape(vocab=512, hidden=512, heads=8, layers=8, mlp=2048, context=1024),
}


def write_tiny_lm(directory: Path, size: LmSize = LmSize.TINY, *, seed: int = SEED + 48) -> str:
    """Write the model folder (``model.onnx``, ``genai_config.json``, tokenizer files) into
    ``directory``; return a one-line description. Another ``seed`` draws other weights: a
    second version of the same model for the fleet's tests (other text, same shape)."""
    from runtimes.examples.tiny_tokenizer import write_tokenizer

    shape = SHAPES[size]
    vocab = write_tokenizer(directory, shape.vocab, shape.context)
    bias = np.full(shape.vocab, SUPPRESSED_LOGIT, dtype=np.float32)
    bias[sorted(printable_token_ids(vocab))] = 0.0
    bias[vocab[EOS]] = EOS_LOGIT
    onnx.save(decoder_onnx(shape, bias, seed), directory / MODEL_FILE)
    _golden(directory, shape).save(directory / GOLDEN_FILE)
    config = genai_config(shape, vocab[EOS])
    (directory / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    params = sum(int(np.prod(t.dims)) for t in onnx.load(directory / MODEL_FILE).graph.initializer)
    return (
        f"causal LM, {shape.layers} layers x {shape.hidden} wide, {params / 1e6:.1f} M "
        f"parameters, context {shape.context} tokens (random weights: gibberish, deterministic)"
    )


def _golden(directory: Path, shape: LmShape) -> GoldenSample:
    """A prompt of 8 tokens through an empty cache, and its logits as ONNX Runtime's CPU
    provider computes them: what ``edgefleet models selftest`` checks a placement against."""
    import onnxruntime as ort

    inputs: dict[str, np.ndarray] = {
        "input_ids": np.arange(40, 48, dtype=np.int64)[None],
        "attention_mask": np.ones((1, 8), dtype=np.int64),
        "position_ids": np.arange(8, dtype=np.int64)[None],
    }
    for layer in range(shape.layers):
        for kind in ("key", "value"):
            empty = np.zeros((1, shape.heads, 0, shape.head_size), dtype=np.float32)
            inputs[f"past_key_values.{layer}.{kind}"] = empty
    session = ort.InferenceSession(str(directory / MODEL_FILE), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], inputs)
    return GoldenSample(inputs, {"logits": logits}, 1e-3, 1e-3)


def genai_config(shape: LmShape, eos_id: int) -> dict[str, object]:
    """ONNX Runtime GenAI's ``genai_config.json`` (its docs/genai/reference/config.md)."""
    return {
        "model": {
            "type": "llama",
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": eos_id,
            "vocab_size": shape.vocab,
            "context_length": shape.context,
            "decoder": {
                "filename": MODEL_FILE,
                "head_size": shape.head_size,
                "hidden_size": shape.hidden,
                "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "session_options": {"log_id": "tiny-lm", "provider_options": []},
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "max_length": shape.context,
            "min_length": 0,
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "length_penalty": 1.0,
            "early_stopping": True,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
        },
    }


class _Graph:
    """Nodes and initializers being collected, with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(name, array)

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, kind: str, inputs: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out


def _masks(g: _Graph) -> str:
    """The additive mask ``[batch, 1, q, past + q]``: padding from ``attention_mask`` plus
    causal order, where query ``i`` sees keys up to ``past + i``."""
    neg = g.const("mask.neg", np.array(-1.0e9, dtype=np.float32))
    one = g.const("mask.one", np.array(1.0, dtype=np.float32))
    m = g.op("Cast", ["attention_mask"], "mask.float", to=TensorProto.FLOAT)
    pad = g.op("Mul", [g.op("Sub", [one, m], "mask.inv"), neg], "mask.pad")
    pad = g.op("Unsqueeze", [pad, g.const("mask.axes", np.array([1, 2]))], "mask.pad4")
    ids_shape = g.op("Shape", ["input_ids"], "mask.ids_shape")
    total = g.op("Shape", ["attention_mask"], "mask.total", start=1, end=2)
    q = g.op("Slice", [ids_shape, g.const("s1", np.array([1])), g.const("s2", np.array([2]))], "q")
    square = g.op("Concat", [q, total], "mask.square", axis=0)
    ones = g.op(
        "ConstantOfShape",
        [square],
        "mask.ones",
        value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
    )
    past = g.op("Squeeze", [g.op("Sub", [total, q], "mask.past1")], "mask.past")
    causal = g.op("Trilu", [ones, past], "mask.tri", upper=0)
    causal = g.op("Mul", [g.op("Sub", [one, causal], "mask.tri_inv"), neg], "mask.causal")
    return g.op("Add", [pad, causal], "mask")


def _attention(g: _Graph, x: str, layer: int, shape: LmShape, mask: str) -> str:
    p, d, h = f"l{layer}.attn", shape.head_size, shape.heads
    scale = 1.0 / np.sqrt(shape.hidden)
    heads_shape = g.const(f"{p}.heads_shape", np.array([0, 0, h, d]))
    merged_shape = g.const(f"{p}.merged_shape", np.array([0, 0, shape.hidden]))

    def project(name: str) -> str:
        w = g.weight(f"{p}.{name}.weight", (shape.hidden, shape.hidden), scale)
        y = g.op("MatMul", [x, w], f"{p}.{name}")
        y = g.op("Reshape", [y, heads_shape], f"{p}.{name}.heads")
        return g.op("Transpose", [y], f"{p}.{name}.t", perm=[0, 2, 1, 3])

    q, k, v = project("q"), project("k"), project("v")
    k = g.op("Concat", [f"past_key_values.{layer}.key", k], f"present.{layer}.key", axis=2)
    v = g.op("Concat", [f"past_key_values.{layer}.value", v], f"present.{layer}.value", axis=2)
    kt = g.op("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt], f"{p}.scores")
    scaled = g.op("Mul", [scores, g.const(f"{p}.scale", np.array(d**-0.5, np.float32))], f"{p}.s")
    probs = g.op("Softmax", [g.op("Add", [scaled, mask], f"{p}.masked")], f"{p}.probs", axis=-1)
    out = g.op("MatMul", [probs, v], f"{p}.ctx")
    out = g.op("Transpose", [out], f"{p}.ctx.t", perm=[0, 2, 1, 3])
    out = g.op("Reshape", [out, merged_shape], f"{p}.ctx.merged")
    w_o = g.weight(f"{p}.o.weight", (shape.hidden, shape.hidden), scale)
    return g.op("MatMul", [out, w_o], f"{p}.out")


def _norm(g: _Graph, x: str, name: str, hidden: int) -> str:
    gamma = g.const(f"{name}.gamma", np.ones(hidden, np.float32))
    beta = g.const(f"{name}.beta", np.zeros(hidden, np.float32))
    return g.op("LayerNormalization", [x, gamma, beta], name, axis=-1, epsilon=1e-5)


def _mlp(g: _Graph, x: str, layer: int, shape: LmShape) -> str:
    p = f"l{layer}.mlp"
    up = g.weight(f"{p}.up", (shape.hidden, shape.mlp), 1.0 / np.sqrt(shape.hidden))
    down = g.weight(f"{p}.down", (shape.mlp, shape.hidden), 1.0 / np.sqrt(shape.mlp))
    u = g.op("MatMul", [x, up], f"{p}.u")
    act = g.op("Mul", [u, g.op("Sigmoid", [u], f"{p}.sig")], f"{p}.silu")
    return g.op("MatMul", [act, down], f"{p}.out")


def decoder_onnx(shape: LmShape, logit_bias: np.ndarray, seed: int = SEED + 48) -> onnx.ModelProto:
    """The decoder graph with weights drawn from ``seed`` (the examples' by default)."""
    g = _Graph(np.random.default_rng(seed))
    tok = g.weight("embed.tokens", (shape.vocab, shape.hidden), 1.0)
    pos = g.weight("embed.positions", (shape.context, shape.hidden), 0.5)
    x = g.op(
        "Add",
        [g.op("Gather", [tok, "input_ids"], "tok"), g.op("Gather", [pos, "position_ids"], "pos")],
        "embed",
    )
    mask = _masks(g)
    for layer in range(shape.layers):
        attn = _attention(g, _norm(g, x, f"l{layer}.ln1", shape.hidden), layer, shape, mask)
        x = g.op("Add", [x, attn], f"l{layer}.res1")
        mlp = _mlp(g, _norm(g, x, f"l{layer}.ln2", shape.hidden), layer, shape)
        x = g.op("Add", [x, mlp], f"l{layer}.res2")
    x = _norm(g, x, "final.ln", shape.hidden)
    head = g.weight("lm_head", (shape.hidden, shape.vocab), 4.0 / np.sqrt(shape.hidden))
    bias = g.const("lm_head.bias", logit_bias.astype(np.float32))
    g.op("Add", [g.op("MatMul", [x, head], "lm_head.out"), bias], "logits")
    kv: list[str | int] = ["batch", shape.heads, "past", shape.head_size]
    kv_out: list[str | int] = ["batch", shape.heads, "total", shape.head_size]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", shape.vocab])
    ]
    for layer in range(shape.layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{layer}.{kind}", TensorProto.FLOAT, kv
                )
            )
            outputs.append(
                helper.make_tensor_value_info(f"present.{layer}.{kind}", TensorProto.FLOAT, kv_out)
            )
    graph = helper.make_graph(g.nodes, "tiny_lm", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.producer_name = "edgefleet"
    onnx.checker.check_model(model)
    return model
