"""The SFT doctor on real families' set-ups (issues 31 and 34): for each family TRL ships a template for,
the course model carrying that family's special tokens, chat template and pad / eos / generation_config
conventions (its tokenizer prepending bos where the checkpoint's does), saved to a directory as a
practitioner's checkpoint would be.

Healthy set-ups a competent practitioner runs (137: chats with and without assistant_only_loss, with
TRL's training template where TRL needs one; prompt/completion text and chat; wrapped / bfd / bfd_split
packing; bf16; the T4 QLoRA recipe — fp16, 2e-4, a LoraConfig; pre-tokenised chats with a
completion_mask; and, ``reasoning_setups``, reasoning and tool-call data: multi-turn reasoning under Qwen3's
and DeepSeek-R1's training templates, gpt-oss's, data without reasoning with enable_thinking=False in the
prompt, tool calls with dict arguments under assistant_only_loss, one row per call step) exit 0 with no
error; planted failures (87: fully truncated and cut answers under bfd, a template without generation
markers, the end of turn outside {% generation %}, a base model's chats without eos_token, fp16 full
fine-tuning at 0.05, float16 weights under fp16, labels shifted by one, template-rendered text tokenized
with a second bos; reasoning dropped by Qwen3's, DeepSeek-R1's and gpt-oss's templates, empty think blocks
graded, tool replies graded, mixed and escaped tool-call arguments, tool calls dropped by Llama 3's
training template, Phi-3's and DeepSeek's, the stop after a call outside {% generation %}, a template that
raises) are found by their own check; nothing ends in a traceback. Measured when each part was first
built: the doctor before issue 31 was right on 78 of 131 (26 tracebacks when pad_token is None); before
issue 34 it passed the 9 healthy reasoning/tool set-ups and found none of the 15 planted failures (a false
trl-preparation error on mixed arguments, exit 3 on DeepSeek's UndefinedError). Built offline from the
course model in seconds."""

import copy
import json
import re
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer, GenerationConfig
from trl.chat_template_utils import qwen2_5_chat_template

from course_utils import load_course_model
from course_utils.data import make_messages
from course_utils.doctor import EXIT_CODES, diagnose
from course_utils.doctor import checks as doctor_checks
from course_utils.doctor.__main__ import main
from course_utils.doctor.reasoning import CHECKS as REASONING_CHECKS
from course_utils.templates import add_generation_markers

TEMPLATES = Path(trl.__file__).parent / "chat_templates"

# Mistral-7B-Instruct-v0.1's template is not among TRL's: as published in its tokenizer_config.json
MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
QWEN_INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Each family's conventions, as its checkpoint publishes them (tokenizer_config.json: special tokens, bos,
# eos, pad; generation_config.json: eos ids, listed by token). `template`: TRL's copy of the original
# (trl/chat_templates/<name>.jinja, byte-identical to the checkpoint's); `training`: the template a
# practitioner passes as chat_template_path for assistant_only_loss where TRL cannot patch the original
# itself (None: TRL patches it, or there is no training template of this family); `chat_eos`: the
# SFTConfig eos_token a competent practitioner sets for chats when generation_config does not stop at
# the end of turn; `stop_moved`: the edit of the training template that moves the end-of-turn token
# out of {% generation %} (a planted failure).
FAMILIES = {
    # meta-llama/Llama-3.1-8B-Instruct: no pad token; generation_config eos [128001, 128008, 128009]
    "llama-3.1-instruct": dict(
        template="llama3_1", specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                       "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None,
        gen_eos=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], training="llama3_training", chat_eos=None,
        stop_moved=("+ '<|eot_id|>' }}\n        {%- endgeneration %}",
                    "}}\n        {%- endgeneration %}{{- '<|eot_id|>' }}")),
    # meta-llama/Llama-3.2-1B (base): eos <|end_of_text|>, no pad, generation_config eos 128001; its
    # tokenizer_config ships the 3.2 chat template
    "llama-3.2-base": dict(
        template="llama3_2", specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                       "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
        bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None, gen_eos=["<|end_of_text|>"],
        training="llama3_training", chat_eos="<|eot_id|>",
        stop_moved=("+ '<|eot_id|>' }}\n        {%- endgeneration %}",
                    "}}\n        {%- endgeneration %}{{- '<|eot_id|>' }}")),
    # Qwen/Qwen2.5-7B-Instruct: eos <|im_end|>, pad <|endoftext|>, generation_config eos [151645, 151643]
    "qwen2.5-instruct": dict(
        template="qwen2_5", specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                      "</tool_call>"],
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", gen_eos=["<|im_end|>", "<|endoftext|>"],
        training=None, chat_eos=None,
        stop_moved=("{{- '\\n' + message.content + '<|im_end|>\\n' }}", "{{- '\\n' + message.content }}",
                    "{%- endgeneration %}", "{%- endgeneration %}{{- '<|im_end|>\\n' }}")),
    # Qwen/Qwen2.5-7B (base): eos = pad = <|endoftext|>, generation_config eos 151643; the Instruct
    # template with another default system prompt (TRL does not know it: no patch)
    "qwen2.5-base": dict(
        template="qwen2_5", system="You are a helpful assistant.",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
        bos=None, eos="<|endoftext|>", pad="<|endoftext|>", gen_eos=["<|endoftext|>"],
        training="qwen2_5_training", chat_eos="<|im_end|>",
        stop_moved=("{{- '\\n' + message.content + '<|im_end|>\\n' }}", "{{- '\\n' + message.content }}",
                    "{%- endgeneration %}", "{%- endgeneration %}{{- '<|im_end|>\\n' }}")),
    # Qwen/Qwen3-8B (thinking template): eos <|im_end|>, pad <|endoftext|>, generation_config eos
    # [151645, 151643]
    "qwen3": dict(
        template="qwen3", specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                    "<tool_call>", "</tool_call>"],
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", gen_eos=["<|im_end|>", "<|endoftext|>"],
        training=None, chat_eos=None, stop_moved=None),
    # google/gemma-3-4b-it: bos <bos>, eos <eos>, pad <pad>; generation_config eos [1, 106] = <eos>,
    # <end_of_turn>
    "gemma-3-it": dict(
        template="gemma3", specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        bos="<bos>", eos="<eos>", pad="<pad>", gen_eos=["<eos>", "<end_of_turn>"], training=None,
        chat_eos=None, stop_moved=None),
    # microsoft/Phi-3-mini-4k-instruct: bos <s>, eos = pad = <|endoftext|>; generation_config eos
    # [32000, 32001, 32007] = <|endoftext|>, <|assistant|>, <|end|>
    "phi-3-mini": dict(
        template="phi3", specials=["<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>",
                                   "<|user|>"],
        bos="<s>", eos="<|endoftext|>", pad="<|endoftext|>", gen_eos=["<|endoftext|>", "<|assistant|>",
                                                                        "<|end|>"],
        training=None, chat_eos=None,
        stop_moved=("{{- message['content'] + '<|end|>\\n' }}\n        {%- endgeneration %}",
                    "{{- message['content'] }}\n        {%- endgeneration %}{{- '<|end|>\\n' }}")),
    # mistralai/Mistral-7B-Instruct-v0.1: bos <s>, eos </s>, no pad; generation_config eos 2 = </s>
    "mistral-v0.1-instruct": dict(
        template=None, specials=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", pad=None,
        gen_eos=["</s>"], training=None, chat_eos=None, stop_moved=None),
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B: eos = pad = <｜end▁of▁sentence｜>; generation_config eos
    # 151643 = <｜end▁of▁sentence｜>
    "deepseek-r1-distill": dict(
        template="deepseek_r1_distill",
        specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                  "<think>", "</think>"],
        bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", pad="<｜end▁of▁sentence｜>",
        gen_eos=["<｜end▁of▁sentence｜>"], training=None, chat_eos=None, stop_moved=None),
    # openai/gpt-oss-20b (harmony format): bos <|startoftext|> (its tokenizer does not prepend it), eos
    # <|return|> (the end of a final answer; earlier turns end with <|end|>), pad <|endoftext|>;
    # generation_config eos [200002, 199999, 200012] = <|return|>, <|endoftext|>, <|call|>
    "gpt-oss": dict(
        template="gptoss", specials=["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                                     "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"],
        bos="<|startoftext|>", adds_bos=False, eos="<|return|>", pad="<|endoftext|>",
        gen_eos=["<|return|>", "<|endoftext|>", "<|call|>"], training=None, chat_eos=None, stop_moved=None),
}


def family_template(name: str) -> str:
    spec = FAMILIES[name]
    if spec["template"] is None:
        return MISTRAL_V01
    text = (TEMPLATES / f"{spec['template']}.jinja").read_text(encoding="utf-8")
    if "system" in spec:
        assert text.count(QWEN_INSTRUCT_SYSTEM) == 2
        text = text.replace(QWEN_INSTRUCT_SYSTEM, spec["system"])
    return text


def build_family(name: str, directory: Path) -> Path:
    """The course model as a checkpoint of ``name``: its special tokens (embeddings resized), template,
    bos / eos / pad and generation_config eos list, saved with save_pretrained."""
    spec = FAMILIES[name]
    model, tok = load_course_model()
    model, tok = copy.deepcopy(model), copy.deepcopy(tok)
    tok.add_tokens([t for t in spec["specials"] if t not in tok.get_vocab()], special_tokens=True)
    model.resize_token_embeddings(len(tok))
    tok.bos_token, tok.eos_token = spec["bos"], spec["eos"]
    tok.pad_token = spec["pad"]
    tok.add_bos_token = spec.get("adds_bos", spec["bos"] is not None)  # as the checkpoint's tokenizer does
    tok.chat_template = family_template(name)
    ids = [tok.convert_tokens_to_ids(t) for t in spec["gen_eos"]]
    model.generation_config.eos_token_id = ids[0] if len(ids) == 1 else ids
    model.generation_config.pad_token_id = None if spec["pad"] is None else tok.pad_token_id
    model.generation_config.bos_token_id = None if spec["bos"] is None else tok.bos_token_id
    model.config.eos_token_id = ids[0]
    model.config.pad_token_id = model.generation_config.pad_token_id
    model.config.bos_token_id = model.generation_config.bos_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def chats(n=24, **kw):
    return [{"messages": m} for m in make_messages(n=n, seed=5, **kw)]


def prompt_completion_text(n=24):
    return [{"prompt": f"Q: what is {a} plus {a}?\nA:", "completion": f" {2 * a}."} for a in range(n)]


def prompt_completion_chat(n=24, **kw):
    return [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in chats(n, **kw)]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Family name -> checkpoint directory (the nine built once per module, ~2 s)."""
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(name, root / name) for name in FAMILIES}


def training_path(name: str) -> dict:
    spec = FAMILIES[name]
    return {} if spec["training"] is None else {
        "chat_template_path": str(TEMPLATES / f"{spec['training']}.jinja")}


def chat_config(name: str, **extra) -> dict:
    eos = FAMILIES[name]["chat_eos"]
    return {"learning_rate": 2e-5, **({"eos_token": eos} if eos else {}), **extra}


# The T4 QLoRA recipe's adapters, as passed to SFTTrainer(peft_config=LoraConfig(...))
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}


def tokenized_chats(directory: Path, n=24, shift=False) -> list[dict]:
    """Chats tokenized by hand with the family's template, the answer graded through completion_mask —
    or, ``shift=True``, through labels shifted by one beforehand (a planted failure)."""
    tok = AutoTokenizer.from_pretrained(directory)
    out = []
    for row in chats(n):
        prompt = len(tok.apply_chat_template(row["messages"][:-1], add_generation_prompt=True,
                                             return_dict=True)["input_ids"])
        ids = tok.apply_chat_template(row["messages"], return_dict=True)["input_ids"]
        if shift:
            out.append({"input_ids": ids, "labels": ([-100] * prompt + ids[prompt:])[1:] + [-100]})
        else:
            out.append({"input_ids": ids, "completion_mask": [0] * prompt + [1] * (len(ids) - prompt)})
    return out


def rendered_text(directory: Path, n=24) -> list[dict]:
    """'text' rows a practitioner rendered with the chat template (its bos included) before training."""
    tok = AutoTokenizer.from_pretrained(directory)
    return [{"text": tok.apply_chat_template(r["messages"], tokenize=False)} for r in chats(n)]


def healthy_setups(name: str, directory: Path | None = None) -> dict:
    """Set-up label -> (data, config[, diagnose keywords]): what a competent practitioner runs on this
    family."""
    setups = {
        "QLoRA recipe: fp16, 2e-4, a LoraConfig": (chats(), chat_config(name, fp16=True, learning_rate=2e-4),
                                                   {"peft_config": LORA}),
        "chats, full-sequence loss": (chats(), chat_config(name)),
        "prompt/completion text": (prompt_completion_text(), {"learning_rate": 2e-5}),
        "prompt/completion chat": (prompt_completion_chat(), chat_config(name)),
        "packing wrapped": (chats(), chat_config(name, packing=True, packing_strategy="wrapped",
                                                   max_length=256)),
        "packing bfd": (chats(), chat_config(name, packing=True, packing_strategy="bfd", max_length=1024)),
        "packing bfd_split": (chats(), chat_config(name, packing=True, packing_strategy="bfd_split",
                                                   max_length=64)),
        "prompt/completion text, bf16": (prompt_completion_text(), {"learning_rate": 2e-5, "bf16": True}),
    }
    for strategy in ("wrapped", "bfd_split"):  # rows past max_length: split, not truncated (no token lost)
        setups[f"long prompts, packing {strategy}"] = (
            prompt_completion_chat(120, context_words=20, long_tail=True),
            chat_config(name, packing=True, packing_strategy=strategy, max_length=72))
    if directory is not None:
        setups["pre-tokenised chats, completion_mask"] = (tokenized_chats(directory), chat_config(name))
    if name != "mistral-v0.1-instruct":  # no training template of this family: TRL cannot mask its turns
        setups["chats, assistant_only_loss"] = (
            chats(), chat_config(name, assistant_only_loss=True, **training_path(name)))
        setups["prompt/completion chat, assistant_only_loss"] = (
            prompt_completion_chat(), chat_config(name, assistant_only_loss=True, **training_path(name)))
    return setups


def planted_setups(name: str, tmp: Path, directory: Path | None = None) -> dict:
    """Set-up label -> (data, config, the check that must find it[, diagnose keywords]): one failure each."""
    spec = FAMILIES[name]
    setups = {
        "fp16 full fine-tuning at 0.05": (chats(), chat_config(name, fp16=True, learning_rate=0.05),
                                          "fp16-overflow-risk"),
        "float16 weights under fp16": (chats(), chat_config(name, fp16=True,
                                                            model_init_kwargs={"dtype": "float16"}),
                                       "load-dtype", {"forward": False}),
        # completion-only loss: a prompt past max_length leaves no graded token
        "fully truncated rows, bfd": (
            prompt_completion_chat(120, context_words=20, long_tail=True),
            chat_config(name, packing=True, packing_strategy="bfd", max_length=72), "fully-truncated"),
    }
    # full-sequence loss: the long rows keep a graded prompt but lose the answer's end and its stop token
    setups["answers cut at max_length, bfd"] = (
        chats(120, context_words=20, long_tail=True),
        chat_config(name, packing=True, packing_strategy="bfd", max_length=72), "answer-truncated")
    own = family_template(name)
    edited = tmp / f"{name}-edited.jinja"  # the family's template with a comment: TRL no longer knows it
    edited.write_text("{#- our copy #}" + own, encoding="utf-8")
    setups["template without generation markers, assistant_only_loss"] = (
        chats(), chat_config(name, assistant_only_loss=True, chat_template_path=str(edited)),
        "template-unpatchable")
    if spec["stop_moved"]:
        text = (TEMPLATES / f"{spec['training'] or spec['template'] + '_training'}.jinja").read_text()
        edits = spec["stop_moved"]
        for old, new in zip(edits[::2], edits[1::2]):
            assert text.count(old) == 1, (name, old)
            text = text.replace(old, new)
        moved = tmp / f"{name}-stop-outside.jinja"
        moved.write_text(text, encoding="utf-8")
        setups["end-of-turn outside {% generation %}"] = (
            chats(), chat_config(name, assistant_only_loss=True, chat_template_path=str(moved)),
            "stop-token-untrained")
    if directory is not None:
        setups["pre-tokenised chats, labels shifted by one"] = (tokenized_chats(directory, shift=True),
                                                               chat_config(name), "labels-misaligned")
        if spec["bos"] is not None and "bos_token" in family_template(name):  # the template renders bos too
            setups["text rendered by the template"] = (rendered_text(directory), {"learning_rate": 2e-5},
                                                       "double-bos")
    if spec["chat_eos"]:  # a base model's generation_config stops at eos, not at the template's turn end
        setups["chats without eos_token"] = (chats(), {"learning_rate": 2e-5}, "eos-mismatch")
    return setups


# The training template a template-unpatchable finding must suggest for the family's own template with one
# edit (None: TRL ships none of this family, so it must suggest none)
OWN_TRAINING = {"llama-3.1-instruct": "llama3", "llama-3.2-base": "llama3", "qwen2.5-instruct": "qwen2_5",
                "qwen2.5-base": "qwen2_5", "qwen3": "qwen3", "gemma-3-it": "gemma3", "phi-3-mini": "phi3",
                "mistral-v0.1-instruct": None, "deepseek-r1-distill": "deepseek_r1_distill",
                "gpt-oss": "gptoss"}


def describe(report) -> str:
    return "; ".join(f"{f.severity} {f.check}: {f.what} ({f.evidence[:100]})" for f in report)


# ---------------------------------------------------------------------------------------------
# Reasoning and tool-call data (issue 34): the course's toy chats with a short reasoning per answer, or a
# tool call and its reply before the answer
# ---------------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {
              "name": "add", "description": "Add two whole numbers.",
              "parameters": {"type": "object", "required": ["a", "b"],
                             "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
         {"type": "function", "function": {
              "name": "reverse_words", "description": "Reverse the order of the words.",
              "parameters": {"type": "object", "properties": {"words": {"type": "string"}},
                             "required": ["words"]}}}]


def reasoning_text(question: str, answer: str, turn: int) -> str:
    return f"Turn {turn}: the user asks {question!r}; working it out gives {answer}."


def reasoning_chats(n=8, turns=1, style="reasoning_content"):
    """Chats of ``turns`` exchanges whose answers carry reasoning, as a field (``style``
    "reasoning_content": Qwen3's, "thinking": gpt-oss's), inline (``"think"``: <think>…</think> before the
    answer in the content, DeepSeek-R1's), or none (``None``)."""
    pairs = make_messages(n=n * turns, seed=5)
    rows = []
    for i in range(n):
        messages = []
        for turn in range(turns):
            user, answer = pairs[i * turns + turn]
            thought = reasoning_text(user["content"], answer["content"], turn)
            if style is None:
                messages += [user, answer]
            elif style == "think":
                messages += [user, {"role": "assistant", "content": f"<think>\n{thought}\n</think>\n\n"
                                                                    f"{answer['content']}"}]
            else:
                messages += [user, {"role": "assistant", "content": answer["content"], style: thought}]
        rows.append({"messages": messages})
    return rows


def tool_call(question: str) -> tuple[str, dict]:
    """The call that answers one of the course's questions: add(a, b) or reverse_words(words)."""
    numbers = re.fullmatch(r"What is (\d+) \+ (\d+)\?", question)
    if numbers:
        return "add", {"a": int(numbers.group(1)), "b": int(numbers.group(2))}
    return "reverse_words", {"words": question.split(": ", 1)[1]}


def tool_chats(n=8, arguments="dict", content=""):
    """user → assistant tool call → tool reply → assistant answer, the tools' schemas in a ``tools``
    column. ``arguments``: "dict", "string" (a JSON string) or "mixed" (every other row a string);
    ``content``: the calling turn's content ("" or None, as OpenAI-style data has it)."""
    rows = []
    for i, (user, answer) in enumerate(make_messages(n=n, seed=5)):
        name, args = tool_call(user["content"])
        as_string = arguments == "string" or (arguments == "mixed" and i % 2 == 1)
        call = {"type": "function", "function": {"name": name, "arguments": json.dumps(args) if as_string
                                                 else args}}
        rows.append({"messages": [user, {"role": "assistant", "content": content, "tool_calls": [call]},
                                  {"role": "tool", "name": name,
                                   "content": json.dumps({"result": answer["content"]})}, answer],
                     "tools": TOOLS})
    return rows


def split_at(rows, k, **extra):
    """Prompt/completion rows: the first ``k`` messages are the prompt (``extra``: more columns)."""
    return [{"prompt": r["messages"][:k], "completion": r["messages"][k:],
             **{c: v for c, v in r.items() if c != "messages"}, **extra} for r in rows]


def tool_stop_outside_template() -> str:
    """TRL's Qwen2.5 training template marked by hand so that the tool-call branch leaves its <|im_end|>
    after {% endgeneration %}: the plain branch (all TRL's stop-token probe renders) is untouched."""
    text = (TEMPLATES / "qwen2_5_training.jinja").read_text(encoding="utf-8")
    old = "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n        {%- endgeneration %}"
    assert text.count(old) == 1
    return text.replace(old, "        {%- endif %}\n        {%- endgeneration %}\n"
                             "        {%- if message.tool_calls %}{{- '<|im_end|>\\n' }}{%- endif %}")


# Templates marked by hand for the set-ups below (written to the test's tmp_path; configs name them)
HAND_MARKED = {"tool-stop-outside.jinja": tool_stop_outside_template,
               "qwen2_5-marked.jinja": lambda: add_generation_markers(qwen2_5_chat_template)}


def reasoning_setups() -> dict:
    """Label -> (family, data, config, the checks that must report): empty for a healthy set-up (exit 0,
    and none of the reasoning/tool checks reports). Built like the corpus above, on TRL's real templates; a
    ``chat_template_path`` of ``HAND_MARKED`` is written by the test."""
    only = {"learning_rate": 2e-5, "assistant_only_loss": True}
    full = {"learning_rate": 2e-5}
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    one_call = [{**r, "messages": r["messages"][:2]} for r in tool_chats()]  # one row per call step
    return {
        # healthy
        "qwen3: multi-turn reasoning, assistant_only_loss (TRL swaps in qwen3_training)": (
            "qwen3", reasoning_chats(turns=2), only, set()),
        "qwen3: single-turn reasoning, the original, full loss": ("qwen3", reasoning_chats(), full, set()),
        "qwen3: no reasoning, enable_thinking=False prompt/completion": (
            "qwen3", split_at(reasoning_chats(style=None), 1, **no_thinking), full, set()),
        "deepseek-r1-distill: multi-turn reasoning, assistant_only_loss (its training template)": (
            "deepseek-r1-distill", reasoning_chats(turns=2, style="think"), only, set()),
        "gpt-oss: reasoning, its training template": ("gpt-oss", reasoning_chats(style="thinking"), only,
                                                       set()),
        "gpt-oss: tool calls, its training template": ("gpt-oss", tool_chats(), only, set()),
        "qwen2.5-instruct: tool calls, dict arguments, assistant_only_loss": (
            "qwen2.5-instruct", tool_chats(), only, set()),
        "qwen2.5-instruct: tool calls, the answer as completion": (
            "qwen2.5-instruct", split_at(tool_chats(), 3), full, set()),
        "llama-3.1-instruct: one row per call, its own template": (
            "llama-3.1-instruct", split_at(one_call, 1), {**full, "max_length": 2048}, set()),  # long schemas
        # planted failures
        "qwen3: multi-turn reasoning, the original, full loss": (
            "qwen3", reasoning_chats(turns=2), full, {"reasoning-lost", "prefix-not-preserved"}),
        "deepseek-r1-distill: reasoning, the original, full loss": (
            "deepseek-r1-distill", reasoning_chats(style="think"), full, {"reasoning-lost"}),
        "gpt-oss: multi-turn reasoning, its training template": (
            "gpt-oss", reasoning_chats(turns=2, style="thinking"), only,
            {"reasoning-lost", "prefix-not-preserved"}),
        "qwen3: no reasoning, the original, full loss": ("qwen3", reasoning_chats(style=None), full,
                                                          {"empty-think-graded"}),
        "qwen3: no reasoning, assistant_only_loss (qwen3_training)": (
            "qwen3", reasoning_chats(style=None), only, {"empty-think-graded"}),
        "qwen2.5-instruct: tool calls, full loss": ("qwen2.5-instruct", tool_chats(), full,
                                                     {"tool-output-graded"}),
        "qwen2.5-instruct: tool replies in the completion": (
            "qwen2.5-instruct", split_at(tool_chats(), 1), full, {"tool-output-graded"}),
        "qwen2.5-instruct: mixed dict / JSON-string arguments": (
            "qwen2.5-instruct", tool_chats(arguments="mixed"), only, {"tool-arguments-mixed"}),
        "qwen2.5-instruct: JSON-string arguments everywhere": (
            "qwen2.5-instruct", tool_chats(arguments="string"), only, {"tool-arguments-escaped"}),
        "llama-3.1-instruct: tool calls, llama3_training.jinja": (
            "llama-3.1-instruct", tool_chats(), {**only, **training_path("llama-3.1-instruct")},
            {"tool-calls-dropped"}),
        "phi-3-mini: tool calls, assistant_only_loss": ("phi-3-mini", tool_chats(), only,
                                                         {"tool-calls-dropped"}),
        "deepseek-r1-distill: tool calls with content '', assistant_only_loss": (
            "deepseek-r1-distill", tool_chats(), only, {"tool-calls-dropped"}),
        "deepseek-r1-distill: tool calls with content None": (
            "deepseek-r1-distill", tool_chats(content=None), full, {"template-error"}),
        "qwen2.5-instruct: hand-marked, <|im_end|> after a call outside {% generation %}": (
            "qwen2.5-instruct", tool_chats(), {**only, "chat_template_path": "tool-stop-outside.jinja"},
            {"tool-stop-untrained"}),
        "qwen2.5-instruct: add_generation_markers (tool-call turns unmarked)": (
            "qwen2.5-instruct", tool_chats(), {**only, "chat_template_path": "qwen2_5-marked.jinja"},
            {"tool-calls-dropped", "tool-stop-untrained"}),
    }


# ---------------------------------------------------------------------------------------------
# The corpus itself
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_checkpoint_carries_its_conventions(name, families):
    spec = FAMILIES[name]
    tok = AutoTokenizer.from_pretrained(families[name])
    assert tok.chat_template == family_template(name)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (spec["bos"], spec["eos"], spec["pad"])
    assert set(spec["specials"]) <= set(tok.all_special_tokens) | set(tok.get_added_vocab())
    eos = GenerationConfig.from_pretrained(families[name]).eos_token_id
    ids = [tok.convert_tokens_to_ids(t) for t in spec["gen_eos"]]
    assert eos == (ids[0] if len(ids) == 1 else ids), "a list where the checkpoint ships a list"
    if spec["template"] and "system" not in spec:  # TRL knows the original byte for byte
        assert family_template(name) == getattr(trl.chat_template_utils, f"{spec['template']}_chat_template")


# ---------------------------------------------------------------------------------------------
# Healthy set-ups: exit 0, no error, nothing unchecked; planted failures: found by their own check
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_healthy_setups_exit_0_without_an_error(name, families):
    wrong = {}
    for label, (data, config, *kw) in healthy_setups(name, families[name]).items():
        report = diagnose(str(families[name]), data, config, **(kw[0] if kw else {}))
        if report.exit_code != 0 or report.checks("error") or report.checks("could-not-check"):
            wrong[label] = describe(report)
    assert not wrong, f"{name}: false alarms on healthy set-ups: {json.dumps(wrong, indent=1)}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_planted_failures_are_found_by_their_own_check(name, families, tmp_path):
    missed = {}
    for label, (data, config, check, *kw) in planted_setups(name, tmp_path, families[name]).items():
        report = diagnose(str(families[name]), data, config, **(kw[0] if kw else {}))
        if check not in report.checks() or report.checks("could-not-check"):
            missed[label] = f"{check} not found: {describe(report)}"
    assert not missed, f"{name}: {json.dumps(missed, indent=1)}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_an_unpatchable_template_is_told_its_own_familys_training_template(name, families, tmp_path):
    """Llama-3.x used to be told qwen3_training.jinja ("88.7 % similar": quick_ratio), Mistral
    gemma_training.jinja: a fix of another family renders another format."""
    planted = planted_setups(name, tmp_path)
    data, config, _ = planted["template without generation markers, assistant_only_loss"]
    report = diagnose(str(families[name]), data, config)
    finding = next(f for f in report if f.check == "template-unpatchable")
    shipped = {m.name for m in TEMPLATES.glob("*_training.jinja")}
    suggested = {t for t in shipped if t in finding.fix}
    expected = OWN_TRAINING[name]
    assert suggested == ({f"{expected}_training.jinja"} if expected else set()), finding.fix
    if expected is None:
        assert "{% generation %}" in finding.fix


# ---------------------------------------------------------------------------------------------
# What each fix mirrors in TRL 1.16's SFTTrainer
# ---------------------------------------------------------------------------------------------

def test_no_pad_token_is_set_as_sfttrainer_sets_it(families):
    """Llama-3.x and Mistral ship no pad: `_pad_eos_findings` used to raise "Asking to pad but the
    tokenizer does not have a padding token". SFTTrainer pads with its eos (pad_token or eos_token)."""
    model, tok = load_course_model()
    llama = AutoTokenizer.from_pretrained(families["llama-3.1-instruct"])
    assert llama.pad_token is None
    report = diagnose(str(families["llama-3.1-instruct"]), prompt_completion_text(), {"learning_rate": 2e-5})
    assert report.exit_code == 0, describe(report)
    finding = next(f for f in report if f.check == "pad-is-eos")  # pad = eos = <|eot_id|>, graded in each row
    assert finding.severity == "info" and "'<|eot_id|>'" in finding.what
    assert "SFTTrainer's own collator pads labels with -100 and keeps them all" in finding.evidence
    # a config pad_token is the one TRL uses: not a stop token, nothing to say
    own_pad = diagnose(str(families["llama-3.1-instruct"]), prompt_completion_text(),
                       {"learning_rate": 2e-5, "pad_token": "<|python_tag|>"})
    assert "pad-is-eos" not in own_pad.checks()


def test_the_callers_tokenizer_is_not_changed(families):
    tok = AutoTokenizer.from_pretrained(families["mistral-v0.1-instruct"])
    model, _ = load_course_model()
    model = copy.deepcopy(model)
    model.resize_token_embeddings(len(tok))
    diagnose((model, tok), chats(), {"learning_rate": 2e-5, "pad_token": "<unk>"})
    assert (tok.pad_token, tok.eos_token) == (None, "</s>")


def test_an_eos_or_pad_token_outside_the_vocabulary_is_trls_error(families):
    report = diagnose(str(families["qwen3"]), chats(), {"learning_rate": 2e-5, "pad_token": "<|pad|>"})
    assert "special-token-unknown" in report.checks("error") and report.exit_code == 1


@pytest.mark.parametrize("name", ["qwen2.5-base", "gemma-3-it", "phi-3-mini", "llama-3.2-base"])
def test_prompt_completion_text_grades_the_eos_trl_appends(name, families):
    """TRL appends tokenizer.eos_token to each completion (not the template's end of turn) and grades it:
    the stop check looks for that token, and generate() stops on it."""
    report = diagnose(str(families[name]), prompt_completion_text(), {"learning_rate": 2e-5})
    assert not {"stop-token-untrained", "eos-mismatch"} & report.checks(), describe(report)


def test_text_rows_whose_eos_generate_ignores_are_an_eos_mismatch(families, tmp_path):
    """The non-chat eos check stays: a generation_config that does not stop on the eos TRL appends."""
    directory = build_family("gemma-3-it", tmp_path / "gemma")
    config = GenerationConfig.from_pretrained(directory)
    config.eos_token_id = AutoTokenizer.from_pretrained(directory).convert_tokens_to_ids("<end_of_turn>")
    config.save_pretrained(directory)
    report = diagnose(str(directory), prompt_completion_text(), {"learning_rate": 2e-5})
    finding = next(f for f in report if f.check == "eos-mismatch")
    assert "'<eos>'" in finding.what and "TRL appends" in finding.evidence


@pytest.mark.parametrize("strategy", ["wrapped", "bfd_split"])
def test_packing_that_splits_rows_warns_answers_packed_apart_instead_of_truncated(strategy, families):
    data = prompt_completion_chat(120, context_words=20, long_tail=True)
    packed = {"learning_rate": 2e-5, "packing": True, "max_length": 72}
    report = diagnose(str(families["qwen2.5-instruct"]), data, {**packed, "packing_strategy": strategy})
    assert not {"fully-truncated", "max-length-below-prompts"} & report.checks()
    finding = next(f for f in report if f.check == "answers-packed-apart")
    assert finding.severity == "warning" and "no token is lost" in finding.evidence
    bfd = diagnose(str(families["qwen2.5-instruct"]), data, {**packed, "packing_strategy": "bfd"})
    assert "fully-truncated" in bfd.checks("error")  # bfd truncates: there the finding is right


def test_answers_cut_at_max_length_lose_their_stop_token(families):
    """A row whose answer starts before max_length and ends after it trains the answer without its end of
    turn; TRL's default max_length (1024) applies when the config is silent."""
    long_answer = [{"prompt": f"Q: count to {a}.\nA:", "completion": " one" * (1100 + a)} for a in range(8)]
    silent = diagnose(str(families["qwen2.5-base"]), long_answer, {"learning_rate": 2e-5})
    finding = next(f for f in silent if f.check == "answer-truncated")
    assert "max_length=1024" in finding.what and finding.severity == "warning"
    roomy = diagnose(str(families["qwen2.5-base"]), long_answer, {"learning_rate": 2e-5, "max_length": 4096})
    assert "answer-truncated" not in roomy.checks()


def test_the_fully_truncated_fix_keeps_every_answer_whole(families):
    """The first max_length the fix names (lesson 08 reads it) leaves no answer cut: the smaller one that
    only keeps a graded token in every row taught some answers without their stop token."""
    data = prompt_completion_chat(120, context_words=20, long_tail=True)
    config = chat_config("qwen3", max_length=72)
    finding = next(f for f in diagnose(str(families["qwen3"]), data, config) if f.check == "fully-truncated")
    suggested = int(finding.fix.split("max_length >= ")[1].split()[0])
    fixed = diagnose(str(families["qwen3"]), data, {**config, "max_length": suggested})
    assert not {"fully-truncated", "answer-truncated"} & fixed.checks(), describe(fixed)
    smaller = int(finding.fix.split("(>= ")[1].split()[0])
    assert smaller < suggested


# ---------------------------------------------------------------------------------------------
# Never a traceback: a check that cannot run is a finding, and exit status 3
# ---------------------------------------------------------------------------------------------

def test_a_check_that_fails_is_reported_as_could_not_check(families, monkeypatch, tmp_path, capsys):
    def broken(*args):
        raise IndexError("list index out of range")

    monkeypatch.setattr(doctor_checks, "stop_token_findings", broken)
    report = diagnose(str(families["qwen3"]), chats(), {"learning_rate": 2e-5})
    finding = next(f for f in report if f.severity == "could-not-check")
    assert finding.check == "stop-token-untrained"
    assert "IndexError: list index out of range" in finding.evidence
    assert report.exit_code == EXIT_CODES["could-not-check"] == 3
    assert "UNCHECKED" in str(report) and "could not run" in str(report)
    assert json.loads(report.to_json())["counts"]["could-not-check"] == 1
    # the other checks still ran: an error found elsewhere still exits 1
    data, config, _ = planted_setups("qwen3", tmp_path)["fully truncated rows, bfd"]
    assert diagnose(str(families["qwen3"]), data, config).exit_code == 1
    data_path = tmp_path / "data.jsonl"
    data_path.write_text("".join(json.dumps(r) + "\n" for r in chats()))
    assert main(["--model", str(families["qwen3"]), "--data", str(data_path)]) == 3
    assert "Traceback" not in capsys.readouterr().err


def test_the_command_on_a_family_checkpoint(families, tmp_path, capsys):
    data_path, config_path = tmp_path / "data.jsonl", tmp_path / "config.json"
    data_path.write_text("".join(json.dumps(r) + "\n" for r in prompt_completion_text()))
    config_path.write_text(json.dumps({"learning_rate": 2e-5}))
    argv = ["--model", str(families["mistral-v0.1-instruct"]), "--data", str(data_path), "--config",
            str(config_path), "--json"]
    assert main(argv) == 0, capsys.readouterr().out
    config_path.write_text(json.dumps({"learning_rate": 2e-5, "assistant_only_loss": True}))
    capsys.readouterr()
    assert main(argv) == 1  # prompt/completion text with assistant_only_loss: TRL refuses
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Reasoning and tool-call set-ups (issue 34): a healthy one exits 0 and none of the new checks reports; a
# planted failure is found by its own check (and by no other of them); nothing ends in a traceback
# ---------------------------------------------------------------------------------------------

NEW_CHECKS = {*REASONING_CHECKS, "tool-arguments-escaped", "template-error", "data-unloadable"}
# In `make test`: a healthy and a broken set-up for each new check (~0.5 s each); the rest in make test-slow
FAST_REASONING = {
    "qwen3: multi-turn reasoning, assistant_only_loss (TRL swaps in qwen3_training)",
    "qwen3: no reasoning, enable_thinking=False prompt/completion",
    "qwen2.5-instruct: tool calls, dict arguments, assistant_only_loss",
    "qwen3: multi-turn reasoning, the original, full loss", "qwen3: no reasoning, the original, full loss",
    "qwen2.5-instruct: tool calls, full loss", "qwen2.5-instruct: mixed dict / JSON-string arguments",
    "qwen2.5-instruct: JSON-string arguments everywhere",
    "llama-3.1-instruct: tool calls, llama3_training.jinja",
    "qwen2.5-instruct: hand-marked, <|im_end|> after a call outside {% generation %}",
    "deepseek-r1-distill: tool calls with content None"}


@pytest.mark.parametrize("label", [pytest.param(label, marks=() if label in FAST_REASONING else
                                                pytest.mark.slow) for label in reasoning_setups()])
def test_reasoning_and_tool_setups(label, families, tmp_path):
    assert FAST_REASONING <= set(reasoning_setups())
    name, data, config, expected = reasoning_setups()[label]
    if config.get("chat_template_path") in HAND_MARKED:
        path = tmp_path / config["chat_template_path"]
        path.write_text(HAND_MARKED[config["chat_template_path"]](), encoding="utf-8")
        config = {**config, "chat_template_path": str(path)}
    report = diagnose(str(families[name]), data, config)
    assert not report.checks("could-not-check"), describe(report)
    assert report.checks() & NEW_CHECKS == expected, describe(report)
    if not expected:
        assert report.exit_code == 0 and not report.checks("error"), describe(report)
