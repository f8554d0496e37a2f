"""Build the embedded course model from nothing, deterministically, in about half a minute.

    python -m course_utils.build_course_model              # rewrites course_utils/course_model
    python -m course_utils.build_course_model --out /tmp/m # somewhere else (the test does this)

What it makes: a byte-level BPE tokenizer (at most 2,048 tokens; this corpus gives ~520) with
Qwen2.5's three special tokens and,
as chat template, the exact Qwen2.5 template string that the installed TRL ships; and a
Qwen2-architecture causal LM (~0.6 M parameters, tied embeddings) pretrained briefly on the
plain-text corpus of ``course_utils.data.pretraining_corpus``. Like a base checkpoint, it knows
the tasks but not the chat format, and its generation config stops on ``<|endoftext|>`` only
(Qwen2.5 base does the same), which lesson 02 is about.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from .data import make_messages, pretraining_corpus
from .model import COURSE_MODEL_DIR, SPECIAL_TOKENS

VOCAB_SIZE = 2048
SEQ_LEN = 128
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


def qwen2_5_chat_template() -> str:
    """The Qwen2.5 (Instruct) chat template exactly as the installed TRL ships it."""
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def _render(template: str, conversations) -> list[str]:
    # Same jinja settings as transformers' apply_chat_template; no tokenizer exists yet.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    compiled = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    return [compiled.render(messages=m, add_generation_prompt=False) for m in conversations]


def train_tokenizer(texts: list[str]):
    """A BPE with exactly the pipeline ``Qwen2Tokenizer`` rebuilds on load, so ids round-trip.

    transformers 5 reconstructs Qwen2 tokenizers (NFC, Qwen's split regex, ByteLevel without its
    own regex); a BPE trained with any other pre-tokenizer would tokenize differently after
    ``save_pretrained`` + ``from_pretrained``, silently.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    import json

    # Qwen2Tokenizer takes (vocab, merges) and rebuilds the rest of the pipeline itself.
    serialised = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in serialised["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=serialised["vocab"], merges=merges, unk_token=None,
                               eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = qwen2_5_chat_template()
    tokenizer.model_max_length = MODEL_SHAPE["max_position_embeddings"]
    return tokenizer


def pretrain(model, rows, steps: int = 400, batch_size: int = 16, lr: float = 3e-3) -> list[float]:
    """Plain next-token pretraining with AdamW and a cosine schedule; returns the loss per step."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    generator = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(steps):
        batch = rows[torch.randint(len(rows), (batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def build(out_dir: Path = COURSE_MODEL_DIR, steps: int = 400, verbose: bool = True):
    """Build tokenizer and model into ``out_dir``; returns ``(model, tokenizer, losses)``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    start = time.perf_counter()
    torch.manual_seed(0)
    docs = pretraining_corpus(n_docs=6000, seed=0)
    # The tokenizer also sees rendered chats (default system prompt included), so that the chat
    # scaffolding costs a few tokens rather than ~60 bytes-as-tokens per conversation.
    chats = _render(qwen2_5_chat_template(), make_messages("mixed", 400, seed=1, context_words=5))
    tokenizer = train_tokenizer(docs + chats)

    stream = tokenizer("\n".join(docs), add_special_tokens=False, verbose=False)["input_ids"]
    n_rows = len(stream) // SEQ_LEN
    rows = torch.tensor(stream[: n_rows * SEQ_LEN]).view(n_rows, SEQ_LEN)

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, rope_theta=10000.0,
                         bos_token_id=None, eos_token_id=eos, pad_token_id=eos, **MODEL_SHAPE)
    model = Qwen2ForCausalLM(config)
    losses = pretrain(model, rows, steps=steps)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos, do_sample=False)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if verbose:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"course model: {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}, "
              f"{n_rows} rows x {SEQ_LEN} tokens; loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
              f"{time.perf_counter() - start:.1f} s -> {out_dir}")
    return model, tokenizer, losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COURSE_MODEL_DIR, help="output directory")
    parser.add_argument("--steps", type=int, default=400, help="pretraining steps")
    args = parser.parse_args(argv)
    build(args.out, steps=args.steps)


if __name__ == "__main__":
    main()
