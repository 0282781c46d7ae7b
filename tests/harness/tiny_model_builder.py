"""Write a tiny random-weight Llama model directory: config.json plus a byte-level BPE tokenizer.

Run with the vLLM venv's interpreter (transformers and tokenizers live there, not in the project
venv): `python tiny_model_builder.py OUT_DIR HEAD_DIM`. No weights are written: the engine serves
it with `--load-format dummy`. Everything is offline and deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
HIDDEN_SIZE = 128
HEADS = 2
KV_HEADS = 1
LAYERS = 2
MAX_POSITIONS = 512


def training_corpus() -> list[str]:
    """Plain English about serving models, enough for a few hundred BPE merges."""
    subjects = ["The server", "A request", "The model", "Each token", "The scheduler", "The GPU", "A user"]
    verbs = ["answers", "streams", "measures", "waits for", "returns", "counts", "sends"]
    objects = ["the prompt", "one chunk", "every reply", "the latency", "a batch of work", "the next word"]
    tails = [
        "quickly.",
        "in order.",
        "without errors.",
        "under load.",
        "at 8000 tokens per second.",
        "again.",
    ]
    lines = []
    for i, subject in enumerate(subjects):
        for j, verb in enumerate(verbs):
            obj = objects[(i + j) % len(objects)]
            tail = tails[(i * 3 + j) % len(tails)]
            lines.append(f"{subject} {verb} {obj} {tail} Step {i * 10 + j}: hello, world!")
    return lines


def build(out: Path, head_dim: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(training_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 2 * HIDDEN_SIZE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim,
        "num_hidden_layers": LAYERS,
        # Exactly the tokenizer's size: a larger vocabulary lets random weights pick ids that
        # decode to nothing.
        "vocab_size": len(fast),
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    build(Path(sys.argv[1]), int(sys.argv[2]))
