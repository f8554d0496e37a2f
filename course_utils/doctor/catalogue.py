"""The doctor's catalogue: every check's stable id, what it needs, a one-line why, its fix and its lesson.

``python -m course_utils.doctor --list-checks`` prints it; ``--ignore ID`` mutes one check (an unknown id is
bad input, with the closest id named); docs/doctor_checks.md is generated from it
(``--list-checks --format markdown``; a test keeps the page current, and another that every id a check can
report is listed here). The id is a finding's ``check``: it never changes once published, so CI
configurations and SARIF annotations that name it keep working.

``needs`` says what a check reads, and so what the command must be given: ``data`` (the rows alone: no model,
no torch), ``set-up`` (``--model``: the tokenizer, the template, TRL's preparation, sometimes the weights),
``run`` (``--run OUTPUT_DIR``: the Trainer's log history), ``doctor`` (about the doctor's own measurement).
"""

from __future__ import annotations

from dataclasses import dataclass

NEEDS = ("data", "set-up", "run", "doctor")


@dataclass(frozen=True)
class Check:
    id: str
    needs: str
    why: str
    fix: str
    lesson: str


def _c(id, needs, lesson, why, fix):
    return Check(id, needs, why, fix, lesson)


_ALL = (
    # --- the data alone (doctor.data_checks): no model, no torch ------------------------------------------
    _c("rendered-markers", "data", "04", "text already rendered with a chat template is rendered (and BOS'd) "
                                         "again, "
       "or taught in another family's format", "give TRL the raw messages and let it apply the model's "
                                               "template"),
    _c("duplicate-rows", "data", "08", "the same row several times weighs it several times and inflates eval "
       "scores when it leaks across splits", "deduplicate (exact, then after normalising case and "
                                             "whitespace)"),
    _c("contradicting-answers", "data", "08", "one prompt with different answers teaches their average",
       "keep one answer per prompt, or make the prompts differ by what decides the answer"),
    _c("response-length-cap", "set-up", "02", "many distinct answers of one length (the longest, or far "
       "above the lengths around it and ending mid-sentence; in tokens or words) were cut by a generation "
       "cap: the model learns to stop mid-sentence", "drop or regenerate the capped answers"),
    _c("response-empty", "data", "02", "an empty answer teaches the model to stop at once",
       "drop the rows or write the answers"),
    _c("response-looping", "data", "02", "an answer that repeats itself teaches the model to loop",
       "drop or regenerate the looping answers"),
    _c("response-copies-prompt", "data", "04", "an answer that repeats the prompt teaches echoing",
       "drop or fix the rows whose answer is the prompt"),
    _c("reasoning-partial", "data", "09", "reasoning in only some answers of a reasoning set: the model "
                                          "learns "
       "to think sometimes, at random", "add the reasoning to every answer, or remove it; a deliberate "
                                        "hybrid: "
       "--ignore reasoning-partial"),
    _c("sharegpt-roles", "data", "04", "roles human/gpt/bot are not user/assistant: templates render nothing "
       "of those turns (Qwen2.5: only its default system prompt), and the run trains on that",
       "map human->user, gpt->assistant (and from/value -> role/content)"),
    _c("unknown-roles", "data", "04", "a role outside system/user/assistant/tool/developer/ipython/function "
       "(Gemini's model, USER in capitals): templates compare exact strings and render those turns as "
       "nothing or the wrong side", "rename each role to TRL's (model->assistant, USER->user)"),
    _c("content-not-string", "data", "04", "a number or dict as content becomes Python text under many "
       "templates (Llama 3: {'name': ...}), so the model learns Python syntax instead of JSON",
       "write every content as a string (json.dumps a structure)"),
    _c("unread-keys", "data", "04", "content in a key the trainer never reads (a 'response' beside "
       "'messages') is silently left out of training", "move the content into the messages (or "
       "prompt/completion), or drop the key"),
    _c("data-folder-files", "data", "08", "a data folder loads only some of its files (split-named ones, the "
       "most common extension's): the rest is never trained on", "pass the training file, or name the files "
       "as the split you mean (train.jsonl)"),
    _c("data-checks", "data", "08", "the data checks could not run (reported as could-not-check)",
       "check the rows by hand; report the set-up"),
    # --- the set-up (--model): templates, stop tokens, labels, padding (lessons 02-05) ---------------------
    _c("no-assistant-turns", "set-up", "04", "rows with nothing for the model to say train it on the user's "
       "side, or TRL refuses them", "drop those rows or add the answer; roles 'assistant', not 'gpt'"),
    _c("assistant-only-loss", "set-up", "04", "assistant_only_loss needs conversational rows",
       "use 'messages' rows, or drop the option"),
    _c("template-unpatchable", "set-up", "04", "TRL cannot add {% generation %} to this template, so "
       "assistant_only_loss cannot mask", "set chat_template_path to a training template of the family; "
       "with tool calls, prompt/completion rows (a content-only template drops the calls)"),
    _c("measured-with-stand-in", "doctor", "04", "the other checks used the suggested training template",
       "re-run the doctor after fixing the template"),
    _c("template", "set-up", "04", "the template check could not run (reported as could-not-check)",
       "check the template by hand; report the set-up"),
    _c("template-error", "set-up", "04", "the chat template raises on a row: SFTTrainer would stop there",
       "fix the row or the template the finding names"),
    _c("chat-template-path", "set-up", "04", "the config swaps in another chat template before training",
       "make sure the template you serve with is that one"),
    _c("special-token-unknown", "set-up", "02", "an eos_token / pad_token not in the vocabulary: TRL raises",
       "name a token the tokenizer has"),
    _c("data-unloadable", "set-up", "08", "datasets' JSON loader (what trl sft uses) cannot read the file",
       "fix the rows the loader names"),
    _c("trl-preparation", "set-up", "04", "TRL's dataset preparation fails on these rows",
       "fix the rows or template it names"),
    _c("stop-token-untrained", "set-up", "02", "the end-of-turn token carries no loss: the model never "
       "learns to stop", "grade the stop token (TRL's *_training.jinja templates do)"),
    _c("eos-mismatch", "set-up", "02", "generate() does not stop at the token the rows end with",
       "set eos_token in the SFTConfig, or pass eos_token_id to generate()"),
    _c("pad-is-eos", "set-up", "02", "pad is the graded stop token: harmless with SFTTrainer, erased by a "
       "pad-masking collator", "keep SFTTrainer's collator or a dedicated pad token"),
    _c("double-bos", "set-up", "04", "rendered text tokenized again starts with two bos tokens",
       "give TRL messages rows, or strip the bos"),
    _c("labels-misaligned", "set-up", "05", "pre-shifted labels train every token on the one after next",
       "labels[i] = input_ids[i] or -100, no shift"),
    _c("right-padding", "set-up", "03", "right padding is fine for training, wrong for batched generate()",
       "padding_side='left' before batched generation"),
    # --- lengths and packing (lessons 03, 05) ---------------------------------------------------------------
    _c("truncation", "set-up", "05", "the truncation checks could not run (reported as could-not-check)",
       "check lengths by hand; report the set-up"),
    _c("fully-truncated", "set-up", "05", "rows whose every graded token is cut at max_length train nothing; "
       "a micro-batch of them is 0/0 = NaN in a hand-written loop", "raise max_length or drop/shorten rows"),
    _c("answer-truncated", "set-up", "05", "answers cut at max_length lose their stop token",
       "raise max_length or shorten the rows"),
    _c("max-length-below-prompts", "set-up", "05", "max_length below most prompts leaves nothing to learn",
       "raise max_length"),
    _c("packing", "set-up", "03", "the packing checks could not run (reported as could-not-check)",
       "check packing by hand; report the set-up"),
    _c("answers-packed-apart", "set-up", "03", "packing splits answers from their prompts",
       "packing_strategy='bfd', or no packing"),
    _c("packing-no-boundaries", "set-up", "03", "packed rows attend across examples",
       "a padding-free attention (flash / sdpa with position_ids), or no packing"),
    # --- precision, learning rate, the trainer (lessons 01, 06) ---------------------------------------------
    _c("precision-and-learning-rate", "set-up", "06", "the precision checks could not run (could-not-check)",
       "check precision by hand; report the set-up"),
    _c("learning-rate", "set-up", "06", "a learning rate far outside the usual range diverges or trains "
       "nothing", "use the usual range (full fine-tuning ~1e-5, LoRA ~1e-4)"),
    _c("fp16-range", "set-up", "06", "the measured activation peak under fp16",
       "bf16 or fp32 when it nears 65504"),
    _c("fp16-overflow-risk", "set-up", "06", "activations reach fp16's 65504 (or will within 1,000 steps): "
       "inf, then NaN", "bf16 or fp32, or a lower learning rate"),
    _c("load-dtype", "set-up", "06", "the dtype the weights train in (fp16 weights under fp16=True: the "
       "GradScaler refuses them; bf16/fp16 weights in full fine-tuning: no float32 master weights, small "
       "updates round away)", "load in float32 and train with bf16=True, or train LoRA adapters"),
    _c("trainer-accumulation", "set-up", "01", "your compute_loss under gradient accumulation (the split "
                                               "test)",
       "divide by num_items_in_batch, not per micro-batch"),
    # --- read from the architecture (doctor.architecture): lessons 07, 10, 12, 13 -----------------------
    _c("loss-count-ignored", "set-up", "07", "a model class with accepts_loss_kwargs=False never gets the "
       "step's token count: under accumulation or several processes the loss is a per-micro-batch mean",
       "trainer.model_accepts_loss_kwargs = True once the trainer is built (SFTTrainer's own loss takes the "
       "count), or one micro-batch a step on one process"),
    _c("adapter-eos", "set-up", "10", "with LoRA, SFTConfig's eos_token stops the in-memory model only: the "
       "saved adapter carries no generation_config", "merge, save with the trained generation_config, check "
       "with python -m course_utils.ship"),
    _c("packing-leak", "set-up", "12", "packed samples attend to each other on this architecture, attention "
       "implementation and collator (lesson 12's two-sample probe)", "train unpacked, or prove another "
       "set-up clean with packing_arch.packing_leak"),
    _c("packing-raises", "set-up", "12", "the first packed step raises on this machine (linear-attention / "
       "Mamba layers without their CUDA kernels)", "train unpacked, or install the kernels and probe again"),
    _c("packing-probe", "set-up", "12", "the packing probe could not run here (FlashAttention, or a family "
       "with no tiny model): what decides it", "run packing_arch.packing_leak on your model and machine"),
    _c("lora-coverage", "set-up", "13", "trainable LoRA parameters per module group, as peft builds them "
       "from your config", "read it: print_trainable_parameters() gives one total"),
    _c("lora-frozen-groups", "set-up", "13", "groups your LoRA targets aim at get no adapter (fused MoE "
       "experts, linear-attention / Mamba mixers); the loss still falls", "target_parameters for the fused "
       "experts (lora_dropout=0), the mixer's Linear names in target_modules"),
    _c("lora-remap", "set-up", "13", "peft's v4->v5 remap rewrote your target_modules for this model type",
       "read the per-group table: it is what trains"),
    _c("lora-config-raises", "set-up", "13", "peft refuses the LoRA config on this architecture: SFTTrainer "
       "raises before the first step", "lora_dropout=0 with target_parameters; a hand list where "
       "\"all-linear\" is refused"),
    # --- reasoning and tool calls (lesson 09) -------------------------------------------------------------
    _c("reasoning-and-tools", "set-up", "09", "the reasoning and tool checks could not run (could-not-check)",
       "check by hand; report the set-up"),
    _c("prefix-not-preserved", "set-up", "09", "the template rewrites earlier reasoning turns once the "
       "conversation goes on", "one row per assistant turn, or a prefix-preserving template"),
    _c("reasoning-lost", "set-up", "09", "the template drops the reasoning: it never reaches the loss",
       "a template that keeps it (TRL's training template of the family)"),
    _c("empty-think-graded", "set-up", "09", "an empty <think></think> is graded in data without reasoning",
       "assistant_only_loss with the family's training template, or add reasoning"),
    _c("tool-output-graded", "set-up", "09", "tool replies carry loss: the model learns to write them",
       "assistant_only_loss=True where TRL's training template keeps the tool calls, else prompt/completion "
       "rows with the replies in the prompt"),
    _c("tool-arguments-mixed", "set-up", "09", "tool-call arguments are dicts in some rows and strings in "
                                               "others",
       "write every call's arguments as an object"),
    _c("tool-arguments-escaped", "set-up", "09", "the template writes string arguments as escaped strings",
       "write the arguments as objects"),
    _c("tool-calls-dropped", "set-up", "09", "the template drops tool calls or leaves them out of the loss",
       "a template that renders tool calls inside {% generation %}"),
    _c("tool-stop-untrained", "set-up", "09", "the stop token after a tool call carries no loss",
       "grade it in the tool-call branch too"),
    # --- a finished run (--run OUTPUT_DIR; run_rules, the same rules as SFTWatch) ---------------------------
    _c("run-nonfinite", "run", "06", "a NaN / inf loss, or gradient norms non-finite to the end: the weights "
       "after it are garbage (a few skipped fp16 GradScaler steps with a finite loss: info, routine)",
       "find the first overflowing module (SFTWatch), bf16/fp32, a lower learning rate"),
    _c("run-zero-loss", "run", "05", "a logged loss of exactly 0.0: a step with no graded token (or NaN "
       "turned into 0)", "drop or shorten the rows whose answer truncation removed"),
    _c("run-clipping", "run", "01", "the gradient clipped on most steps: the learning rate no longer sets "
                                    "the "
       "step", "check the loss scale (a sum instead of a mean), then the learning rate"),
    _c("run-grad-spike", "run", "06", "a gradient norm 10x the median before it", "inspect that step's rows "
       "and the precision"),
    _c("run-loss-diverging", "run", "01", "the training loss rose over the run", "lower the learning rate"),
    _c("run-loss-flat", "run", "05", "the training loss did not move: nothing trains", "check the learning "
       "rate, trainable parameters and labels"),
    _c("run-lr-zero", "run", "01", "a learning rate of 0 on most steps: no weight changes",
       "check learning_rate and the scheduler"),
    _c("run-eval-rising", "run", "08", "eval loss rising while train loss falls: memorising the training "
                                       "rows",
       "keep the best checkpoint, fewer epochs, more (deduplicated) data"),
    _c("run-log", "run", "08", "the run's log history holds no training step: the run rules had nothing to "
       "judge (could-not-check)", "log training steps (logging_steps) and read a state saved after them"),
    _c("run-checkpoints", "run", "08", "which trainer_state.json the autopsy read, and where the run ended",
       "nothing: information"),
    # --- the doctor itself ---------------------------------------------------------------------------------
    _c("sample", "doctor", "08", "the checks ran on a random sample; rates come with 95 % intervals (copies "
       "and contradictions: counted over every row of the file)",
       "--all checks every row"),
    _c("data-only", "doctor", "08", "only the data checks ran: no --model was given",
       "add --model for the set-up checks (templates, labels, lengths, precision)"),
)

CHECKS = {c.id: c for c in _ALL}


def closest(check: str) -> str:
    """`` (did you mean 'x'?)`` with the catalogue id closest to ``check``, or nothing when none is close."""
    import difflib

    close = difflib.get_close_matches(str(check), sorted(CHECKS), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def table(fmt: str = "text") -> str:
    """The catalogue as text (one check a line), markdown (docs/doctor_checks.md) or JSON."""
    import json

    if fmt == "json":
        return json.dumps([c.__dict__ for c in _ALL], indent=2)
    if fmt == "markdown":
        lines = ["# The SFT doctor's checks", "",
                 "Generated by `python -m course_utils.doctor --list-checks --format markdown > "
                 "docs/doctor_checks.md` from `course_utils/doctor/catalogue.py` (a test keeps it current). "
                 "`--ignore ID` mutes a check. *needs*: `data` runs on the rows alone (`--data`, no model, "
                 "no "
                 "torch), `set-up` needs `--model`, `run` reads `--run OUTPUT_DIR`.", "",
                 "| id | needs | lesson | why | fix |", "|---|---|---|---|---|"]
        lines += [f"| `{c.id}` | {c.needs} | {c.lesson} | {c.why} | {c.fix} |" for c in _ALL]
        return "\n".join(lines) + "\n"
    width = max(len(c.id) for c in _ALL)
    return "\n".join(f"{c.id:<{width}}  {c.needs:<6}  {c.lesson}  {c.why}" for c in _ALL)
