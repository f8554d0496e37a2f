"""Build the shipped course models from nothing, deterministically, in well under a minute each.

    python -m tools.build_course_model                      # rebuilds every shipped model
    python -m tools.build_course_model --model tiny-llama   # one of them
    python -m tools.build_course_model --model tiny-qwen --out /tmp/m   # elsewhere (tests)
    python -m tools.build_course_model --model heldout-neox --out /tmp/heldout-neox   # never shipped
    python -m tools.build_course_model --model heldout-neox --out /tmp/ni --instruct   # eos = <|im_end|>

One builder, one ``Recipe`` per model. Every model gets: a byte-level BPE tokenizer trained on its
own text, Qwen2.5's three special tokens (``<|endoftext|>`` as eos and pad, ``<|im_start|>``,
``<|im_end|>``) and, as chat template, the exact Qwen2.5 template string that the installed TRL
ships, so every lesson applies to every model; and a small causal LM pretrained briefly on plain
text only. Like a base checkpoint, it knows the tasks but not the chat format, and its generation
config stops on ``<|endoftext|>`` only (Qwen2.5 base does the same), which lesson 02 is about.

The two shipped recipes differ on purpose, so that a lesson's claim that holds on both is not a
property of one model (issue 12):

- ``tiny-qwen``  (``course_utils/course_model``): Qwen2, 2 layers, width 128, tied embeddings;
  Qwen2's pre-tokenizer (digits split one by one); trained on ``data.pretraining_corpus``.
- ``tiny-llama`` (``course_utils/course_model_llama``): Llama, 3 layers, width 96, one KV head,
  untied embeddings; GPT-2's pre-tokenizer (digit runs stay together, so ``42`` can be one
  token); trained on ``prose_corpus`` below: other sentences, a larger word list, other seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.data import WORDS, make_messages, pretraining_corpus
from course_utils.model import SHIPPED_MODELS, SPECIAL_TOKENS


@dataclass(frozen=True)
class Recipe:
    """Everything that makes one model: its text, its tokenizer, its architecture, its training.

    ``model_type`` is any transformers causal-LM type (``AutoConfig.for_model``); ``shape`` holds
    that architecture's own config keys. ``pretokenizer`` is ``"qwen2"`` (the pipeline
    ``Qwen2Tokenizer`` rebuilds on load, see ``train_tokenizer``) or ``"gpt2"`` (GPT-2's byte-level
    split, saved as a plain ``tokenizer.json`` that loads verbatim).
    """

    name: str
    model_type: str
    shape: dict
    corpus: Callable[[int, int], list[str]]  # (n_docs, seed) -> plain-text documents
    pretokenizer: str = "qwen2"
    vocab_size: int = 2048
    n_docs: int = 6000
    chat_seed: int = 1       # rendered chats the tokenizer also sees (scaffolding in few tokens)
    chat_context_words: int = 5
    seed: int = 0            # corpus, weight init and batch order
    specials_last: bool = False  # the special tokens at the end of the vocabulary (ids >= the BPE's), not 0-2
    # Llama / Mistral / Gemma conventions ("gpt2" pre-tokenizer only: its tokenizer.json loads verbatim): a
    # BOS token the tokenizer prepends to every encoded text, and a pad token of its own (else pad = eos)
    bos_token: str | None = None
    pad_token: str | None = None
    # the end-of-document token (eos; the pad too unless pad_token is given): Qwen's name or Llama 2's "</s>"
    eos_token: str = "<|endoftext|>"
    # embedding rows rounded up to a multiple of this (0: one row per token), as Qwen2.5 (151,936 rows for
    # 151,665 tokens) and Phi-3 ship: rows no token uses, so len(tokenizer) < config.vocab_size
    pad_vocab_to: int = 0
    seq_len: int = 128
    steps: int = 400
    batch_size: int = 16
    lr: float = 3e-3
    config_extra: dict = field(default_factory=dict)


# A second vocabulary for tiny-llama: the lessons' words plus as many others, so its BPE merges
# (and token counts of the lessons' data) differ from tiny-qwen's.
PROSE_WORDS = tuple(WORDS) + tuple(
    "river stone cloud field garden window door table chair lamp book paper letter song bird fish "
    "horse mouse rabbit wolf bear frog snow rain wind storm leaf root seed flower grass forest "
    "quick heavy light sharp round empty full early late tall short wide narrow deep".split()
)
VERBS = "sees finds carries follows watches keeps paints counts hides lifts".split()


def prose_corpus(n_docs: int = 5000, seed: int = 0) -> list[str]:
    """tiny-llama's pretraining text: the two tasks and filler prose, in other words than tiny-qwen's.

    Plain text only (no chat markup), like ``data.pretraining_corpus``, so that SFT has to teach
    the chat format and when to stop; the tasks are phrased differently on purpose.
    """
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.3:
            a, b = rng.randrange(60), rng.randrange(60)
            phrase = rng.choice(("adding {a} and {b} gives {s}.", "the sum of {a} and {b} equals {s}.",
                                 "{a} and {b} make {s} together."))
            docs.append(phrase.format(a=a, b=b, s=a + b))
        elif kind < 0.6:
            words = [rng.choice(PROSE_WORDS) for _ in range(rng.randint(2, 6))]
            docs.append(f"read backwards, {' '.join(words)} becomes {' '.join(reversed(words))}.")
        else:
            sentence = []
            for _ in range(rng.randint(1, 3)):
                a, b, c, d = (rng.choice(PROSE_WORDS) for _ in range(4))
                sentence.append(f"a {a} {b} {rng.choice(VERBS)} the {c} {d}")
            docs.append(", and ".join(sentence).capitalize() + ".")
    return docs


RECIPES = {
    "tiny-qwen": Recipe(
        name="tiny-qwen", model_type="qwen2", corpus=pretraining_corpus,
        shape=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=True, rope_theta=10000.0),
    ),
    "tiny-llama": Recipe(
        name="tiny-llama", model_type="llama", corpus=prose_corpus, pretokenizer="gpt2",
        vocab_size=1024, n_docs=5000, chat_seed=7, chat_context_words=3, seed=1, seq_len=96,
        steps=350, batch_size=16, lr=4e-3,
        shape=dict(hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=3,
                   num_key_value_heads=1, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=50000.0),
    ),
}


# Held-out models: never shipped, never tuned on. A maintainer builds one into a folder and runs the
# lessons on it (COURSE_MODEL=<folder>) to see whether a claim is the lesson's or the course model's
# (issue 46): each differs from both shipped models in what decided a claim before — architecture and
# parameter names (GPT-NeoX: ``gpt_neox.embed_in`` / ``embed_out``), tied or untied embeddings, width,
# vocabulary size and merges, corpus and seeds.
#   python -m tools.build_course_model --model heldout-neox --out /tmp/heldout-neox
#   COURSE_MODEL=/tmp/heldout-neox python -m tools.robustness ...   (or nbval one notebook)
HELD_OUT = {
    "heldout-neox": Recipe(
        name="heldout-neox", model_type="gpt_neox", corpus=prose_corpus, pretokenizer="gpt2",
        vocab_size=3072, n_docs=6000, chat_seed=11, chat_context_words=4, seed=3, seq_len=128,
        steps=400, batch_size=16, lr=3e-3,
        shape=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, rotary_pct=0.25, use_parallel_residual=True),
    ),
    # GPT-2: learned absolute positions (no rotary), LayerNorm, GELU, Conv1D projections (c_attn, c_fc),
    # tied embeddings (wte); a larger vocabulary whose special tokens are its last ids.
    "heldout-gpt2": Recipe(
        name="heldout-gpt2", model_type="gpt2", corpus=prose_corpus, pretokenizer="gpt2",
        vocab_size=4096, n_docs=6000, chat_seed=13, chat_context_words=4, seed=11, seq_len=128,
        steps=450, batch_size=16, lr=3e-3, specials_last=True,
        shape=dict(n_embd=128, n_inner=384, n_layer=2, n_head=4, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    ),
    # Mistral: untied, grouped-query attention 4:1, a wider MLP, its own rope base; Qwen's pre-tokenizer.
    "heldout-mistral": Recipe(
        name="heldout-mistral", model_type="mistral", corpus=pretraining_corpus, pretokenizer="qwen2",
        vocab_size=2560, n_docs=6000, chat_seed=17, chat_context_words=3, seed=13, seq_len=128,
        steps=400, batch_size=16, lr=3e-3,
        shape=dict(hidden_size=128, intermediate_size=448, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=1, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, rope_theta=100000.0, sliding_window=None),
    ),
    # Gemma: embeddings scaled by sqrt(hidden) in the forward, GeGLU, head_dim set apart from the width, tied.
    "heldout-gemma": Recipe(
        name="heldout-gemma", model_type="gemma", corpus=prose_corpus, pretokenizer="qwen2",
        vocab_size=2048, n_docs=6000, chat_seed=19, chat_context_words=5, seed=17, seq_len=128,
        steps=400, batch_size=16, lr=3e-3,
        shape=dict(hidden_size=96, intermediate_size=288, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=32, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=True, rope_theta=10000.0),
    ),
    # Phi-3: fused projections (qkv_proj, gate_up_proj: other LoRA target names), untied.
    "heldout-phi3": Recipe(
        name="heldout-phi3", model_type="phi3", corpus=pretraining_corpus, pretokenizer="gpt2",
        vocab_size=1800, n_docs=6000, chat_seed=23, chat_context_words=4, seed=19, seq_len=128,
        steps=400, batch_size=16, lr=3e-3,
        shape=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, original_max_position_embeddings=1024,
                          resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
    ),
    "heldout-llama": Recipe(
        name="heldout-llama", model_type="llama", corpus=pretraining_corpus, pretokenizer="gpt2",
        vocab_size=1536, n_docs=6000, chat_seed=5, chat_context_words=5, seed=7, seq_len=128,
        steps=450, batch_size=16, lr=4e-3,
        shape=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=2,
                   num_key_value_heads=2, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=20000.0),
    ),
    # Qwen3's architecture (q/k norms, head_dim apart from the width), untied, with Llama 2's special
    # tokens: tokenizer(text) prepends <s>, eos is </s> (no "<|endoftext|>" in the vocabulary), and
    # padding uses <pad>, not eos (real Llama / Mistral / Gemma tokenizers differ from Qwen's in all
    # three); the chat tokens and template stay Qwen2.5's.
    "heldout-bos": Recipe(
        name="heldout-bos", model_type="qwen3", corpus=prose_corpus, pretokenizer="gpt2",
        vocab_size=2304, n_docs=6000, chat_seed=29, chat_context_words=4, seed=23, seq_len=128,
        steps=400, batch_size=16, lr=3e-3, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
        shape=dict(hidden_size=96, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, rope_theta=10000.0),
    ),
    # Wider and deeper than every other model (width 192, 4 layers), Llama-style, untied, and an embedding
    # matrix padded to a multiple of 256 rows, as real checkpoints ship theirs: len(tokenizer) < vocab_size.
    "heldout-wide": Recipe(
        name="heldout-wide", model_type="llama", corpus=pretraining_corpus, pretokenizer="qwen2",
        vocab_size=3000, n_docs=6000, chat_seed=31, chat_context_words=4, seed=29, seq_len=128,
        steps=400, batch_size=16, lr=2e-3, pad_vocab_to=256,
        shape=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                   num_key_value_heads=2, max_position_embeddings=1024),
        config_extra=dict(tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5),
    ),
}


def qwen2_5_chat_template() -> str:
    """The Qwen2.5 (Instruct) chat template exactly as the installed TRL ships it."""
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def _render(template: str, conversations) -> list[str]:
    # Same jinja settings as transformers' apply_chat_template; no tokenizer exists yet.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    compiled = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    return [compiled.render(messages=m, add_generation_prompt=False) for m in conversations]


def _recipe(recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    known = {**RECIPES, **HELD_OUT}
    if recipe not in known:
        raise ValueError(
            f"recipe={recipe!r} is not one of the builder's models — it knows only its recipes — "
            f"pass one of {sorted(known)} or a Recipe(...)."
        )
    return known[recipe]


def _trained_bpe(texts: list[str], recipe: Recipe):
    """A raw ``tokenizers`` BPE with the recipe's pre-tokenizer, trained on ``texts``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    if recipe.pretokenizer == "qwen2":
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif recipe.pretokenizer == "gpt2":
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        raise ValueError(
            f"pretokenizer={recipe.pretokenizer!r} is unknown — it decides how text is split before "
            "BPE, and only two are tested to round-trip — use 'qwen2' or 'gpt2'."
        )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size,
                                  special_tokens=[] if recipe.specials_last else _specials(recipe),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    if recipe.specials_last:  # appended after the learned merges: eos and pad are the last ids, not 0
        bpe.add_special_tokens(_specials(recipe))
    extra = [t for t in (recipe.bos_token, recipe.pad_token) if t]
    if extra:
        bpe.add_special_tokens(extra)
    if recipe.bos_token:  # as Llama's does: tokenizer(text) starts with BOS, the chat template adds none
        from tokenizers import processors

        bos_id = bpe.token_to_id(recipe.bos_token)
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{recipe.bos_token} $A", pair=f"{recipe.bos_token} $A {recipe.bos_token} $B",
            special_tokens=[(recipe.bos_token, bos_id)])
    return bpe


def _specials(recipe: Recipe) -> list[str]:
    """The eos and the two chat tokens, in that order: ids 0, 1, 2 unless the recipe puts them last."""
    return [recipe.eos_token, *SPECIAL_TOKENS[1:]]


def train_tokenizer(texts: list[str], recipe="tiny-qwen"):
    """A byte-level BPE over ``texts`` that round-trips through ``save_pretrained`` + ``AutoTokenizer``.

    transformers 5 reconstructs Qwen2 tokenizers on load (NFC, Qwen's split regex, ByteLevel
    without its own regex); a BPE trained with any other pre-tokenizer and saved as a
    ``Qwen2Tokenizer`` would tokenize differently after reload, silently. So a ``"qwen2"`` recipe
    trains with exactly that pipeline and saves as ``Qwen2Tokenizer``; a ``"gpt2"`` recipe saves
    as a generic ``TokenizersBackend``, which loads ``tokenizer.json`` as written.
    """
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    recipe = _recipe(recipe)
    if (recipe.bos_token or recipe.pad_token or recipe.eos_token != SPECIAL_TOKENS[0]) \
            and recipe.pretokenizer != "gpt2":
        raise ValueError(f"recipe {recipe.name!r}: bos_token, pad_token and another eos_token need "
                         "pretokenizer='gpt2' — a Qwen2Tokenizer rebuilds its pipeline on load and would "
                         "drop the BOS — use 'gpt2'.")
    bpe = _trained_bpe(texts, recipe)
    if recipe.pretokenizer == "qwen2":
        # Qwen2Tokenizer takes (vocab, merges) and rebuilds the rest of the pipeline itself.
        serialised = json.loads(bpe.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in serialised["merges"]]
        tokenizer = Qwen2Tokenizer(vocab=serialised["vocab"], merges=merges, unk_token=None,
                                   eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=recipe.eos_token,
                                            pad_token=recipe.pad_token or recipe.eos_token,
                                            **({"bos_token": recipe.bos_token} if recipe.bos_token else {}))
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = qwen2_5_chat_template()
    tokenizer.model_max_length = recipe.shape["max_position_embeddings"]
    return tokenizer


def pretrain(model, rows, steps: int = 400, batch_size: int = 16, lr: float = 3e-3,
             seed: int = 0) -> list[float]:
    """Plain next-token pretraining with AdamW and a cosine schedule; returns the loss per step."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    generator = torch.Generator().manual_seed(seed)
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


def build(out_dir: Path | None = None, steps: int | None = None, verbose: bool = True,
          recipe="tiny-qwen"):
    """Build ``recipe``'s tokenizer and model into ``out_dir``; returns ``(model, tokenizer, losses)``.

    ``recipe``: a name from ``RECIPES`` or a ``Recipe`` (e.g. a throwaway model of another
    architecture for a robustness check). ``out_dir`` defaults to the shipped directory of a
    shipped recipe; ``steps`` to the recipe's.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    recipe = _recipe(recipe)
    if out_dir is None:
        if recipe.name not in SHIPPED_MODELS:
            raise ValueError(
                f"recipe {recipe.name!r} has no shipped directory — only {sorted(SHIPPED_MODELS)} "
                "ship with the course — pass out_dir=..."
            )
        out_dir = SHIPPED_MODELS[recipe.name]
    steps = recipe.steps if steps is None else steps
    start = time.perf_counter()
    torch.manual_seed(recipe.seed)
    docs = recipe.corpus(recipe.n_docs, recipe.seed)
    # The tokenizer also sees rendered chats (default system prompt included), so that the chat
    # scaffolding costs a few tokens rather than ~60 bytes-as-tokens per conversation.
    conversations = make_messages("mixed", 400, seed=recipe.chat_seed,
                                  context_words=recipe.chat_context_words)
    chats = _render(qwen2_5_chat_template(), conversations)
    tokenizer = train_tokenizer(docs + chats, recipe)

    if recipe.bos_token:  # as a Llama-style model is pretrained: every document starts with BOS
        stream = [i for ids in tokenizer(docs, verbose=False)["input_ids"] for i in ids]
    else:
        stream = tokenizer("\n".join(docs), add_special_tokens=False, verbose=False)["input_ids"]
    n_rows = len(stream) // recipe.seq_len
    rows = torch.tensor(stream[: n_rows * recipe.seq_len]).view(n_rows, recipe.seq_len)

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    bos = tokenizer.bos_token_id if recipe.bos_token else None
    step = recipe.pad_vocab_to or 1
    embedding_rows = -(-len(tokenizer) // step) * step  # one per token, or rounded up past the tokens
    config = AutoConfig.for_model(recipe.model_type, vocab_size=embedding_rows, bos_token_id=bos,
                                  eos_token_id=eos, pad_token_id=pad, **recipe.shape, **recipe.config_extra)
    model = AutoModelForCausalLM.from_config(config)
    losses = pretrain(model, rows, steps=steps, batch_size=recipe.batch_size, lr=recipe.lr, seed=recipe.seed)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False,
                                               **({"bos_token_id": bos} if bos is not None else {}))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if verbose:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{recipe.name} ({recipe.model_type}): {n_params / 1e6:.2f} M parameters, vocab "
              f"{len(tokenizer)}, {n_rows} rows x {recipe.seq_len} tokens; loss {losses[0]:.2f} -> "
              f"{losses[-1]:.2f}; {time.perf_counter() - start:.1f} s -> {out_dir}")
    return model, tokenizer, losses


def give_instruct_convention(out_dir: Path) -> None:
    """Turn the saved model in ``out_dir`` into an *instruct*-convention checkpoint, as Qwen2.5-Instruct
    ships: eos = ``<|im_end|>`` in ``tokenizer_config.json``, ``config.json`` and ``generation_config.json``
    (the end-of-document token stays, as the pad). Same weights: what differs is only what decides lesson
    02's, 09's and 10's stop claims (``course_utils.model.is_instruct_checkpoint``)."""
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    end_of_turn = AutoTokenizer.from_pretrained(out_dir).convert_tokens_to_ids("<|im_end|>")
    names = ("tokenizer_config.json", "config.json", "generation_config.json")
    files = {name: out_dir / name for name in names}
    data = {name: json.loads(path.read_text(encoding="utf-8")) for name, path in files.items()}
    data["tokenizer_config.json"]["eos_token"] = "<|im_end|>"
    data["config.json"]["eos_token_id"] = data["generation_config.json"]["eos_token_id"] = end_of_turn
    for name, path in files.items():
        path.write_text(json.dumps(data[name], indent=2) + "\n", encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted({**RECIPES, **HELD_OUT}), action="append",
                        help="which model to build (repeatable; default: every shipped one; a held-out "
                             "one needs --out)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the model's shipped directory; one --model only)")
    parser.add_argument("--steps", type=int, default=None, help="pretraining steps (default: the recipe's)")
    parser.add_argument("--instruct", action="store_true",
                        help="give it the instruct convention (eos = <|im_end|>, as Qwen2.5-Instruct ships); "
                             "a held-out model only")
    args = parser.parse_args(argv)
    names = args.model or sorted(RECIPES)
    if args.out is not None and len(names) != 1:
        parser.error("--out needs exactly one --model")
    if args.out is None and any(n in HELD_OUT for n in names):
        parser.error("a held-out model is not shipped — give it a folder: --out /tmp/<name>")
    if args.instruct and (args.out is None or names[0] not in HELD_OUT):
        parser.error("--instruct changes a held-out model's files — pass one held-out --model and --out")
    for name in names:
        build(args.out, steps=args.steps, recipe=name)
    if args.instruct:
        give_instruct_convention(args.out)


if __name__ == "__main__":
    main()
