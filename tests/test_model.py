"""The shipped course models: what ships, how they load, and that they rebuild identically.

Every test that is about "a shipped model" runs on both (tiny-qwen, tiny-llama): the lessons rely
on the same special tokens, eos/pad and chat template in each, whatever the architecture.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from course_utils import COURSE_MODEL_DIR, load_course_model, make_messages
from course_utils.model import SHIPPED_MODELS, course_model_name, course_seed, model_source
from tools.build_course_model import HELD_OUT, RECIPES, build, qwen2_5_chat_template

SAMPLE_TEXTS = [
    "the words red cat blue reversed are blue cat red.",
    "12 plus 30 is 42.\nÀ bientôt, naïve café — 😀 tabs\tand  spaces",
]
# What differs between the two on purpose (architecture, width/depth, tokenizer family).
EXPECTED = {
    "tiny-qwen": dict(model_type="qwen2", tied=True, tokenizer_class="Qwen2Tokenizer", layers=2, width=128),
    "tiny-llama": dict(model_type="llama", tied=False, tokenizer_class="TokenizersBackend", layers=3,
                       width=96),
}
NAMES = sorted(SHIPPED_MODELS)


@pytest.fixture(scope="module", params=NAMES)
def shipped(request):
    """``(name, model, tokenizer)`` of each shipped model, loaded by its short name."""
    model, tokenizer = load_course_model(request.param)
    return request.param, model, tokenizer


def _ids(tokenizer, conversations):
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations] + SAMPLE_TEXTS
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _held_out_loss(model, tokenizer, recipe) -> float:
    held_out = "\n".join(recipe.corpus(200, 99))
    ids = torch.tensor([tokenizer(held_out, add_special_tokens=False, verbose=False)["input_ids"][:512]])
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


def test_both_models_are_registered_and_have_recipes():
    assert NAMES == sorted(RECIPES) == ["tiny-llama", "tiny-qwen"]
    assert SHIPPED_MODELS["tiny-qwen"] == COURSE_MODEL_DIR


@pytest.mark.parametrize("name", NAMES)
def test_shipped_checkpoint_is_small_safetensors(name):
    weights = SHIPPED_MODELS[name] / "model.safetensors"
    assert weights.exists() and weights.stat().st_size <= 10 * 2**20
    assert not list(SHIPPED_MODELS[name].glob("*.bin")), "weights ship as safetensors only"


def test_architecture_and_special_tokens(shipped):
    name, model, tokenizer = shipped
    expected = EXPECTED[name]
    assert model.config.model_type == expected["model_type"]
    assert model.config.tie_word_embeddings == expected["tied"]
    assert model.config.num_hidden_layers == expected["layers"]
    assert model.config.hidden_size == expected["width"]
    assert 0.3e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert model.generation_config.eos_token_id == 0, "like Qwen2.5 base: stops on <|endoftext|> only"
    assert model.config.eos_token_id == model.config.pad_token_id == 0
    assert model.config.bos_token_id is None, "no bos: the Qwen2.5 template starts with <|im_start|>"
    assert tokenizer("hi", add_special_tokens=True)["input_ids"] == tokenizer("hi", add_special_tokens=False)[
        "input_ids"], "the tokenizer adds no bos/eos of its own, as Qwen2.5's"


def test_the_two_models_really_differ():
    """Other text, other vocabulary: the same chat tokenizes into different ids and counts."""
    qwen = AutoTokenizer.from_pretrained(SHIPPED_MODELS["tiny-qwen"])
    llama = AutoTokenizer.from_pretrained(SHIPPED_MODELS["tiny-llama"])
    assert len(qwen) != len(llama)
    conversations = make_messages("mixed", 20, seed=3, context_words=6)
    assert _ids(qwen, conversations) != _ids(llama, conversations)
    assert qwen.apply_chat_template(conversations[0], tokenize=False) == llama.apply_chat_template(
        conversations[0], tokenize=False), "same template, same text"


def test_chat_template_is_trls_qwen2_5_exactly(shipped):
    from trl.chat_template_utils import qwen2_5_chat_template as trl_template

    _, _, tokenizer = shipped
    assert tokenizer.chat_template == trl_template == qwen2_5_chat_template()


def test_apply_chat_template_tokens_equal_tokenizing_its_text(shipped):
    _, _, tokenizer = shipped
    for conversation in make_messages("mixed", 5, seed=4, context_words=3):
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]
        assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_tokenizer_round_trips_through_save_and_autotokenizer(shipped, tmp_path):
    """The transformers-5 pitfall: Qwen2Tokenizer rebuilds its pipeline on load (FACTS.md)."""
    name, _, tokenizer = shipped
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((SHIPPED_MODELS[name] / "config.json").read_text())
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    conversations = make_messages("mixed", 20, seed=3, context_words=6)
    assert _ids(reloaded, conversations) == _ids(tokenizer, conversations)
    assert type(reloaded).__name__ == EXPECTED[name]["tokenizer_class"]
    assert reloaded.decode(_ids(reloaded, [])[-1]) == SAMPLE_TEXTS[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_rebuild_is_deterministic(name, tmp_path):
    recipe = RECIPES[name]
    model, rebuilt_tok, losses = build(tmp_path, verbose=False, recipe=name)
    shipped_dir = SHIPPED_MODELS[name]
    for file in ("tokenizer.json", "config.json", "generation_config.json"):
        assert json.loads((tmp_path / file).read_text()) == json.loads((shipped_dir / file).read_text()), file
    shipped_model, tokenizer = load_course_model(name)
    reloaded, reloaded_tok = load_course_model(tmp_path)
    conversations = make_messages("mixed", 10, seed=5)
    assert _ids(reloaded_tok, conversations) == _ids(tokenizer, conversations)
    # Weights agree only up to float noise (thread scheduling, CPU kernels) amplified by hundreds of
    # steps, by an amount that depends on the CPU (tiny-llama's held-out loss: 3.05 shipped vs 2.87
    # rebuilt on an Intel Xeon, within 5 % on the AMD EPYC it was built on). So compare what the model
    # knows against what pretraining taught it: the held-out losses agree to a tenth of the drop.
    a = _held_out_loss(shipped_model, tokenizer, recipe)
    b = _held_out_loss(reloaded, tokenizer, recipe)
    assert abs(a - b) < 0.1 * (losses[0] - max(a, b)), (a, b, losses[0])
    assert losses[-1] < losses[0] / 2, "pretraining must actually lower the loss"


# A fresh process that imports course_utils and loads the model, offline by itself:
# test_core.test_the_course_is_offline_by_itself_without_make


def test_course_model_env_var_selects_a_local_path(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", str(COURSE_MODEL_DIR))
    model, _ = load_course_model()
    assert model.config.model_type == "qwen2"
    assert course_model_name() == "tiny-qwen"


@pytest.mark.parametrize(("env", "model_type"),
                         [(None, "qwen2"), ("tiny-qwen", "qwen2"), ("tiny-llama", "llama")])
def test_course_model_short_names(monkeypatch, env, model_type):
    if env is None:
        monkeypatch.delenv("COURSE_MODEL", raising=False)
    else:
        monkeypatch.setenv("COURSE_MODEL", env)
    model, _ = load_course_model()
    assert model.config.model_type == model_type
    assert course_model_name() == (env or "tiny-qwen")


def test_course_model_name_of_other_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_MODEL", str(tmp_path))
    assert course_model_name() == str(tmp_path)
    assert course_model_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert course_model_name(SHIPPED_MODELS["tiny-llama"]) == "tiny-llama"


@pytest.mark.parametrize(("raw", "seed"), [(None, 0), ("", 0), ("0", 0), ("2", 2), (" 17 ", 17)])
def test_course_seed_reads_the_environment(monkeypatch, raw, seed):
    if raw is None:
        monkeypatch.delenv("COURSE_SEED", raising=False)
    else:
        monkeypatch.setenv("COURSE_SEED", raw)
    assert course_seed() == seed


@pytest.mark.parametrize("raw", ["-1", "1.5", "one", "0x1", "²"])
def test_course_seed_rejects_bad_values_with_what_why_fix(monkeypatch, raw):
    monkeypatch.setenv("COURSE_SEED", raw)
    with pytest.raises(ValueError) as excinfo:
        course_seed()
    message = str(excinfo.value)
    assert f"COURSE_SEED={raw!r}" in message and "seeds" in message and "COURSE_SEED=0" in message


@pytest.mark.parametrize(
    ("kwargs", "env", "words"),
    [
        ({"name_or_path": "Qwen/Qwen2.5-0.5B"}, {"HF_HUB_OFFLINE": "1"},
         ["HF_HUB_OFFLINE", "load_course_model()"]),
        ({"name_or_path": 3}, {}, ["not a path or hub id", "tiny-llama"]),
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


def test_unknown_recipe_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="tiny-llama"):
        build(tmp_path, recipe="tiny-gpt")


def test_held_out_models_differ_from_the_shipped_ones_and_are_never_shipped():
    """What decided a claim before (architecture, tied embeddings, width, vocabulary) differs from both
    shipped models in at least one held-out model; building one needs a folder of its own."""
    shipped = list(RECIPES.values())
    assert any(r.model_type not in {s.model_type for s in shipped} for r in HELD_OUT.values())
    def width(recipe):  # GPT-2's config calls it n_embd
        return recipe.shape.get("hidden_size", recipe.shape.get("n_embd"))

    for recipe in HELD_OUT.values():
        assert all((width(recipe), recipe.vocab_size, recipe.corpus, recipe.seed)
                   != (width(s), s.vocab_size, s.corpus, s.seed) for s in shipped)
    with pytest.raises(ValueError, match="out_dir"):
        build(None, recipe="heldout-neox")


def test_a_missing_shipped_model_says_how_to_restore_it(monkeypatch, tmp_path):
    from course_utils import model as model_module

    monkeypatch.setitem(model_module.SHIPPED_MODELS, "tiny-llama", tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match="build_course_model"):
        load_course_model("tiny-llama")


# ---- issue 42, part 3: a missing path is not a hub id -------------------------------------------------
@pytest.mark.parametrize("given", ["/no/such/dir/model", "./no-such", "../no-such", "~/no-such"])
def test_a_missing_path_is_refused_not_read_as_a_hub_id(given, tmp_path):
    with pytest.raises(ValueError, match="is a filesystem path and nothing is there .* — .+ — ") as caught:
        model_source(given)
    assert repr(given) in str(caught.value)
    with pytest.raises(ValueError, match="nothing is there"):
        model_source(tmp_path / "missing")
    assert model_source("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B", "a hub id stays one"


@pytest.mark.parametrize("given", ["", "  ", 3])
def test_course_model_name_refuses_what_names_no_model(given):
    with pytest.raises(ValueError, match="is not a path or hub id — .+ — "):
        course_model_name(given)


def test_a_bos_recipe_prepends_bos_and_pads_with_its_own_token(tmp_path):
    """heldout-bos's conventions (Llama 2's, Mistral's): tokenizer(text) starts with <s>, the chat template
    adds none, eos is </s>, pad is its own token; they survive save_pretrained + AutoTokenizer.
    A Qwen2 pipeline would drop the BOS on load, so the builder refuses the combination."""
    import dataclasses

    from tools.build_course_model import prose_corpus, train_tokenizer

    recipe = dataclasses.replace(HELD_OUT["heldout-bos"], vocab_size=400)
    train_tokenizer(prose_corpus(200, 0), recipe).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer("a river")["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    # Llama 2's eos: no "<|endoftext|>" at all, so a helper that asks for it by name gets None
    assert tokenizer.eos_token == "</s>" and tokenizer.convert_tokens_to_ids("<|endoftext|>") is None
    conversation = make_messages("mixed", 1, seed=0)[0]
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]
    assert tokenizer.bos_token_id not in ids
    with pytest.raises(ValueError, match="gpt2"):
        train_tokenizer(["a b"], dataclasses.replace(recipe, pretokenizer="qwen2"))


def test_a_padded_vocabulary_recipe_ships_rows_no_token_uses(tmp_path):
    """heldout-wide's layout (Qwen2.5's, Phi-3's): the embedding matrix rounded up past the tokenizer."""
    model, tokenizer, _ = build(tmp_path, steps=1, verbose=False, recipe="heldout-wide")
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows % HELD_OUT["heldout-wide"].pad_vocab_to == 0 and rows > len(tokenizer)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token_id == tokenizer.eos_token_id


def test_the_instruct_copy_changes_the_eos_convention_only(tmp_path):
    """``--instruct``: eos = <|im_end|> in the tokenizer and both configs, the document end stays as the pad,
    the weights untouched: the checkpoint lesson 02's premise does not hold on (CI's robustness matrix)."""
    import shutil

    from course_utils.model import is_instruct_checkpoint
    from tools.build_course_model import give_instruct_convention

    shutil.copytree(SHIPPED_MODELS["tiny-qwen"], tmp_path / "m")
    give_instruct_convention(tmp_path / "m")
    model, tok = load_course_model(str(tmp_path / "m"))
    base, base_tok = load_course_model("tiny-qwen")
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    assert is_instruct_checkpoint(tok) and not is_instruct_checkpoint(base_tok)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == end_of_turn
    assert tok.pad_token == "<|endoftext|>"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
