"""``tiny-lm``, the example generative model: deterministic, small, printable under greedy
decoding, and an ONNX Runtime GenAI folder that ``onnxruntime-genai`` itself loads and decodes
to the same tokens as the agent's engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtimes.examples import write_example_repository
from runtimes.examples.tiny_lm import EOS_LOGIT, SUPPRESSED_LOGIT
from runtimes.examples.tiny_tokenizer import CORPUS, EOS, learn_merges

PROMPT = "The edge device serves"


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    write_example_repository(root, models=("tiny-lm",))
    return root / "tiny-lm" / "1"


def greedy_tokens(lm_dir: Path, prompt: list[int], n: int) -> list[int]:
    """A plain greedy loop over the model with a growing KV cache (no agent code)."""
    config = json.loads((lm_dir / "genai_config.json").read_text())["model"]["decoder"]
    session = ort.InferenceSession(str(lm_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    heads, size = config["num_key_value_heads"], config["head_size"]
    past = {
        f"past_key_values.{layer}.{kind}": np.zeros((1, heads, 0, size), np.float32)
        for layer in range(config["num_hidden_layers"])
        for kind in ("key", "value")
    }
    out, ids, length = [], prompt, 0
    for _ in range(n):
        feed = {
            "input_ids": np.array([ids]),
            "position_ids": np.arange(length, length + len(ids))[None],
            "attention_mask": np.ones((1, length + len(ids)), np.int64),
            **past,
        }
        names = [o.name for o in session.get_outputs()]
        results = dict(zip(names, session.run(None, feed), strict=True))
        length += len(ids)
        ids = [int(results["logits"][0, -1].argmax())]
        out.append(ids[0])
        past = {k: results[k.replace("past_key_values", "present")] for k in past}
    return out


def test_it_is_small_and_written_the_same_every_time(lm_dir: Path, tmp_path: Path) -> None:
    write_example_repository(tmp_path, models=("tiny-lm",))
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json", "genai_config.json"):
        ours = hashlib.sha256((lm_dir / name).read_bytes()).hexdigest()
        again = hashlib.sha256((tmp_path / "tiny-lm" / "1" / name).read_bytes()).hexdigest()
        assert ours == again, name
    assert 1_000_000 < (lm_dir / "model.onnx").stat().st_size < 5_000_000


def test_merges_break_ties_by_the_pair_not_by_order() -> None:
    assert learn_merges(CORPUS, 400) == learn_merges(CORPUS, 400)
    vocab, merges = learn_merges(CORPUS, 400)
    assert len(vocab) == 400 and len(merges) == 400 - 256 - 5


def test_greedy_decoding_gives_printable_text(lm_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(lm_dir / "tokenizer.json"))
    for prompt in (PROMPT, "a", "<|user|>\nhello<|end|>\n<|assistant|>\n"):
        tokens = greedy_tokens(lm_dir, tokenizer.encode(prompt).ids, 60)
        text = tokenizer.decode(tokens)
        assert text.isprintable() and len(text) >= 60, text
        assert tokenizer.token_to_id(EOS) not in tokens


def test_eos_is_reachable_by_sampling_but_control_tokens_are_not(lm_dir: Path) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(lm_dir / "model.onnx")
    bias = next(
        numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "lm_head.bias"
    )
    vocab = json.loads((lm_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert bias[vocab[EOS]] == EOS_LOGIT > SUPPRESSED_LOGIT
    assert bias[vocab["Ċ"]] == SUPPRESSED_LOGIT  # "\n", a control byte
    assert bias[vocab["Ġthe"]] == 0.0


def test_onnxruntime_genai_loads_the_folder_and_decodes_the_same_tokens(lm_dir: Path) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(lm_dir))
    tokenizer = og.Tokenizer(model)
    prompt = [int(t) for t in tokenizer.encode(PROMPT)]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 40, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    theirs = []
    while not generator.is_done():
        generator.generate_next_token()
        theirs.append(int(generator.get_next_tokens()[0]))
    del generator
    assert theirs == greedy_tokens(lm_dir, prompt, 40)
    assert tokenizer.decode(theirs).isprintable()
