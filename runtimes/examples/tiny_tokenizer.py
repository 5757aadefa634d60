"""The tiny language model's tokenizer: byte-level BPE built in code, no hub, no training run.

The merges are learned here from a fixed corpus by a plain BPE loop whose ties break by the
pair itself, so the same vocabulary comes out on every machine and every ``tokenizers``
release. The file is an ordinary Hugging Face ``tokenizer.json`` (ONNX Runtime GenAI and the
agent both read it) with a chat template in ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = """
The edge device serves models close to where the data is made. A fleet of devices follows
the control plane, which pushes signed models in waves and rolls them back when a gate fails.
Every request is answered by the model version the device holds, and the device keeps serving
when its network is gone. Small language models run on the device too: they read a prompt,
write one token at a time, and share each step with the other streams that are running.
Sensors report temperature, pressure and vibration; the model tells normal from strange.
An operator reads the summary, asks a question, and gets an answer without a round trip.
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def learn_merges(corpus: str, vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE over ``corpus`` until ``vocab_size`` tokens (special ones included)."""
    table = bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[table[b]] = len(vocab)
    # GPT-2's pre-tokenisation in short: a word keeps the space before it
    words = Counter(
        tuple(table[b] for b in w.encode())
        for w in re.findall(r" ?[A-Za-z]+| ?[^A-Za-z\s]+", corpus)
    )
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        # the most frequent pair; equal counts by the pair itself, never by dict order
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab["".join(best)] = len(vocab)
        words = Counter({_merge(w, best): c for w, c in words.items()})
    return vocab, merges


def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def printable_token_ids(vocab: dict[str, int]) -> set[int]:
    """Tokens whose bytes are all printable ASCII (space to ``~``): what greedy decoding may
    emit, so that every answer is printable text."""
    decode = {c: b for b, c in bytes_to_unicode().items()}
    allowed = set()
    for token, index in vocab.items():
        if token in SPECIAL_TOKENS:
            continue
        raw = [decode[c] for c in token]
        if all(32 <= b <= 126 for b in raw):
            allowed.add(index)
    return allowed


def write_tokenizer(directory: Path, vocab_size: int, context_length: int) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json``; return the vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = learn_merges(CORPUS, vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": EOS,
        "add_bos_token": False,
        "model_max_length": context_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return vocab
