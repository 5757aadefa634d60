"""The example LM's weights as a GGUF file for llama.cpp, same dimensions, same numbers.

The tiny LM is GPT-2 shaped (learned positions, pre-LayerNorm, a two-matrix MLP, no RoPE), so
it maps onto llama.cpp's ``gpt2`` architecture tensor for tensor, not onto ``llama`` (RoPE,
RMSNorm and a gated three-matrix MLP would change the work per token). What does not map:
the MLP's activation (llama.cpp's gpt2 uses GELU, the ONNX model SiLU) and the logit bias
that keeps the ONNX model's greedy text printable; both change the text, not the cost of a
token. Biases gpt2 requires and the ONNX model lacks are written as zeros.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def _initializers(model_path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(model_path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def write_gguf(folder: Path, out: Path) -> Path:
    """Write ``out`` from the GenAI folder ``folder`` (``model.onnx``, ``genai_config.json``,
    ``tokenizer.json``); return ``out``."""
    import gguf

    config = json.loads((folder / "genai_config.json").read_text())["model"]
    decoder = config["decoder"]
    w = _initializers(folder / decoder["filename"])
    hidden, layers = int(decoder["hidden_size"]), int(decoder["num_hidden_layers"])
    mlp = w["l0.mlp.up"].shape[1]
    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_name("edgefleet-tiny-lm")
    writer.add_context_length(int(config["context_length"]))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(mlp)
    writer.add_block_count(layers)
    writer.add_head_count(int(decoder["num_attention_heads"]))
    writer.add_head_count_kv(int(decoder["num_key_value_heads"]))
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _tokenizer(writer, folder, int(config["eos_token_id"]))

    def add(name: str, array: np.ndarray) -> None:
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    zeros = np.zeros
    # ONNX MatMul weights are [in, out]; ggml wants [out, in] in numpy order
    add("token_embd.weight", w["embed.tokens"])
    add("position_embd.weight", w["embed.positions"])
    for i in range(layers):
        a, m = f"l{i}.attn", f"l{i}.mlp"
        add(f"blk.{i}.attn_norm.weight", w[f"l{i}.ln1.gamma"])
        add(f"blk.{i}.attn_norm.bias", w[f"l{i}.ln1.beta"])
        qkv = np.concatenate([w[f"{a}.{p}.weight"].T for p in ("q", "k", "v")], axis=0)
        add(f"blk.{i}.attn_qkv.weight", qkv)
        add(f"blk.{i}.attn_qkv.bias", zeros(3 * hidden))
        add(f"blk.{i}.attn_output.weight", w[f"{a}.o.weight"].T)
        add(f"blk.{i}.attn_output.bias", zeros(hidden))
        add(f"blk.{i}.ffn_norm.weight", w[f"l{i}.ln2.gamma"])
        add(f"blk.{i}.ffn_norm.bias", w[f"l{i}.ln2.beta"])
        add(f"blk.{i}.ffn_up.weight", w[f"{m}.up"].T)
        add(f"blk.{i}.ffn_up.bias", zeros(mlp))
        add(f"blk.{i}.ffn_down.weight", w[f"{m}.down"].T)
        add(f"blk.{i}.ffn_down.bias", zeros(hidden))
    add("output_norm.weight", w["final.ln.gamma"])
    add("output_norm.bias", w["final.ln.beta"])
    add("output.weight", w["lm_head"].T)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _tokenizer(writer: object, folder: Path, eos: int) -> None:
    """The byte-level BPE of ``tokenizer.json`` as GGUF's ``gpt2`` tokenizer."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    special = {t["content"] for t in spec.get("added_tokens", [])}
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([control if t in special else normal for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
