"""The embedded course model: what ships, how it loads, and that it rebuilds identically."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from course_utils import COURSE_MODEL_DIR, load_course_model, make_messages
from course_utils.build_course_model import build, qwen2_5_chat_template
from course_utils.data import pretraining_corpus

SAMPLE_TEXTS = [
    "the words red cat blue reversed are blue cat red.",
    "12 plus 30 is 42.\nÀ bientôt, naïve café — 😀 tabs\tand  spaces",
]


def _ids(tokenizer, conversations):
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations] + SAMPLE_TEXTS
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_shipped_checkpoint_is_small_safetensors():
    weights = COURSE_MODEL_DIR / "model.safetensors"
    assert weights.exists() and weights.stat().st_size <= 10 * 2**20
    assert not list(COURSE_MODEL_DIR.glob("*.bin")), "weights ship as safetensors only"


def test_architecture_and_special_tokens(course):
    model, tokenizer = course
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert 0.3e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert model.generation_config.eos_token_id == 0, "like Qwen2.5 base: stops on <|endoftext|> only"


def test_chat_template_is_trls_qwen2_5_exactly(tokenizer):
    from trl.chat_template_utils import qwen2_5_chat_template as trl_template

    assert tokenizer.chat_template == trl_template == qwen2_5_chat_template()


def test_tokenizer_round_trips_through_save_and_autotokenizer(tokenizer, tmp_path):
    """The transformers-5 pitfall: Qwen2Tokenizer rebuilds its pipeline on load (FACTS.md)."""
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    conversations = make_messages("mixed", 20, seed=3, context_words=6)
    assert _ids(reloaded, conversations) == _ids(tokenizer, conversations)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"


def test_rebuild_is_deterministic(tokenizer, tmp_path):
    model, rebuilt_tok, losses = build(tmp_path, verbose=False)
    shipped = json.loads((COURSE_MODEL_DIR / "tokenizer.json").read_text())
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == shipped
    reloaded, reloaded_tok = load_course_model(tmp_path)
    conversations = make_messages("mixed", 10, seed=5)
    assert _ids(reloaded_tok, conversations) == _ids(tokenizer, conversations)
    # Weights agree only up to float noise (thread scheduling, CPU kernels) amplified by 400 steps,
    # so compare what the model knows: its loss on held-out text of the pretraining distribution.
    shipped_model, _ = load_course_model()
    held_out = "\n".join(pretraining_corpus(n_docs=200, seed=99))
    ids = torch.tensor([tokenizer(held_out, add_special_tokens=False, verbose=False)["input_ids"][:512]])
    with torch.no_grad():
        a = shipped_model(input_ids=ids, labels=ids).loss.item()
        b = reloaded(input_ids=ids, labels=ids).loss.item()
    assert abs(a - b) < 0.05 * a, (a, b)
    assert losses[-1] < losses[0] / 2, "pretraining must actually lower the loss"


def test_offline_import_and_load_in_a_fresh_process():
    code = "from course_utils import load_course_model; m, t = load_course_model(); print(len(t))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("COURSE_MODEL", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_course_model_env_var_selects_a_local_path(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", str(COURSE_MODEL_DIR))
    model, _ = load_course_model()
    assert model.config.model_type == "qwen2"


@pytest.mark.parametrize(
    ("kwargs", "env", "words"),
    [
        ({"name_or_path": "Qwen/Qwen2.5-0.5B"}, {"HF_HUB_OFFLINE": "1"},
         ["HF_HUB_OFFLINE", "load_course_model()"]),
        ({"name_or_path": 3}, {}, ["not a path or hub id"]),
        ({"name_or_path": ""}, {}, ["not a path or hub id"]),
        ({"device": "cuda"}, {}, ["CUDA", "device='cpu'"]),
    ],
)
def test_bad_input_gives_what_why_fix(monkeypatch, kwargs, env, words):
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError) as excinfo:
        load_course_model(**kwargs)
    for word in words:
        assert word in str(excinfo.value)


def test_directory_without_config_is_rejected(tmp_path: Path):
    with pytest.raises(ValueError, match="config.json"):
        load_course_model(tmp_path)
