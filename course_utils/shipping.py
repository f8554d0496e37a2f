"""Lesson 10 (the fix that did not ship): what a saved model directory holds, how a user or a serving
stack loads it, and whether that model is the one you trained.

A run can be healthy and the model a user downloads still broken: what was fixed in memory is not what
was written to disk. ``PeftModel.save_pretrained`` writes the adapter and its config only — no
``generation_config.json`` — so an end-of-turn fix made through ``SFTConfig(eos_token=...)`` stays in
memory; a LoRA-only loader drops the embedding rows ``modules_to_save`` trained; a model saved in bf16
loads in bf16 under transformers 5's ``dtype="auto"``. This module measures each:

- ``saved_files(directory)``: what is on disk, as a practitioner reads it — the files, the kind
  (``"adapter"`` or ``"full"``), the eos ids ``generate()`` will use, the dtype, the tied embeddings.
- ``load_saved(directory, base=None)``: load it as a user or a server does — an adapter on its base
  (peft uses the *base's* ``generation_config``; an adapter directory's own ``generation_config.json``
  is not read), a full directory with ``dtype="auto"``.
- ``lora_only_copy(adapter_dir, out_dir)``: the adapter as a loader that keeps only the LoRA matrices
  sees it (no ``modules_to_save``).
- ``logit_drift(reference, model, batches)``: max |Δlogit| and the mean next-token KL on real tokens.
- ``ship_report(trained_model, trained_tokenizer, saved_dir)``: the ship check — logits within a
  tolerance, stops on the end-of-turn token with the saved ``generation_config``, the same chat
  template, the special tokens' rows as trained, the dtype stated. ``python -m course_utils.ship
  --trained DIR --saved DIR [--base DIR] [--json]`` runs it from a shell (exit 0 healthy, 1 with what
  differs and the fix, 2 on bad input).

The exercises' checkers (a ``save_for_serving`` to write, saved directories to diagnose) are in
``course_utils.exercises.lesson10``; the reference answers in ``course_utils.exercises.answers.lesson10``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import validate
from .data import end_of_turn_token, make_batches, make_messages

# max |Δlogit| a faithful copy may show. Measured on both course models: merging the LoRA adapter into the
# float32 base and reloading moves logits by ~2e-5 (round-off of W + BA); a bf16 save moves them by ~0.1-0.3.
# The tolerance sits ~40x above the first and ~100x below the second.
LOGIT_TOLERANCE = 1e-3
STOP_SLACK = 0.1  # the saved model may stop on this fraction fewer probe prompts than the trained one
PROBE_SEED = 9_000  # probe conversations no lesson trains on
ADAPTER_FILES = ("adapter_config.json",)
FULL_FILES = ("config.json",)


@dataclass(frozen=True)
class ShipFinding:
    """One check of the ship report: ``ok``, what was measured (``detail``) and, when not ok, the ``fix``."""

    check: str
    ok: bool
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        return f"[{'OK' if self.ok else 'FAIL'}] {self.check}: {self.detail}" + (
            "" if self.ok else f"\n       fix: {self.fix}")


class ShipInputError(ValueError):
    """The ship check cannot run on what it was given (not a model directory, a base it cannot find)."""


# ------------------------------------------------------------------------------------------------
# What is on disk
# ------------------------------------------------------------------------------------------------

def _directory(name: str, value) -> Path:
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise TypeError(f"{name}={value!r} is not a directory path — the helper reads the files a "
                        "save_pretrained() wrote there — pass the directory, e.g. trainer.args.output_dir.")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ShipInputError(f"{name}={str(path)!r} is not a directory — there is nothing to load — pass the "
                             "directory save_pretrained() / trainer.save_model() wrote.")
    if not any((path / f).exists() for f in (*ADAPTER_FILES, *FULL_FILES)):
        raise ShipInputError(f"{name}={str(path)!r} holds neither config.json nor adapter_config.json "
                             f"(files: {sorted(p.name for p in path.iterdir())[:8]}) — it is not a saved "
                             "model — point at the directory that save_pretrained() wrote.")
    return path


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _eos_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def saved_files(directory) -> dict:
    """What a saved model directory holds, as a practitioner reads it.

    Returns ``files`` (sorted names), ``kind`` (``"adapter"`` when it has ``adapter_config.json``, else
    ``"full"``), ``base`` (an adapter's ``base_model_name_or_path``), ``modules_to_save`` (an adapter's
    fully saved modules), ``generation_eos`` (the ``eos_token_id`` of the directory's own
    ``generation_config.json``, None without one), ``has_tokenizer`` / ``has_chat_template``, ``dtype`` and
    ``tie_word_embeddings`` (a full directory's ``config.json``).
    """
    path = _directory("directory", directory)
    files = sorted(p.name for p in path.iterdir())
    adapter = _read_json(path / "adapter_config.json")
    config = _read_json(path / "config.json") or {}
    generation = _read_json(path / "generation_config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json") or {}
    return {
        "files": files,
        "kind": "adapter" if adapter is not None else "full",
        "base": (adapter or {}).get("base_model_name_or_path"),
        "modules_to_save": (adapter or {}).get("modules_to_save"),
        "generation_eos": None if generation is None else _eos_list(generation.get("eos_token_id")),
        "has_tokenizer": "tokenizer.json" in files or "tokenizer_config.json" in files,
        "has_chat_template": "chat_template.jinja" in files or "chat_template" in tokenizer_config,
        "dtype": config.get("dtype", config.get("torch_dtype")),
        "tie_word_embeddings": config.get("tie_word_embeddings"),
    }


# ------------------------------------------------------------------------------------------------
# Loading it as a user or a server does
# ------------------------------------------------------------------------------------------------

def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _base_source(path: Path, base) -> str:
    """Where an adapter's base is: ``base`` if given, else its config's ``base_model_name_or_path``."""
    recorded = (_read_json(path / "adapter_config.json") or {}).get("base_model_name_or_path")
    source = base if base is not None else recorded
    if not source:
        raise ShipInputError(f"the adapter in {str(path)!r} names no base model and none was given — an "
                             "adapter is only the difference to a base — pass "
                             "base=<the base model's directory> (--base DIR).")
    local = Path(source).expanduser()
    if local.is_dir():
        if not (local / "config.json").exists():
            raise ShipInputError(f"the base {str(local)!r} has no config.json — the adapter needs the full "
                                 "base model — pass the directory the base was saved to (--base DIR).")
        return str(local)
    if _offline() and not (local.is_absolute() or str(source).startswith((".", "~"))):
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(str(source), "config.json"), str):
            return str(source)  # a hub id in the local cache: loads offline
    if local.is_absolute() or str(source).startswith((".", "~")) or _offline():
        raise ShipInputError(f"the adapter's base {source!r} cannot be found here (not a local directory, "
                             "and HF_HUB_OFFLINE forbids a download) — a server would fail the same way — "
                             "pass the base's local directory with base=... (--base DIR).")
    return str(source)


def load_saved(directory, base=None, *, dtype="auto"):
    """``(model, tokenizer)`` as a user or a serving stack loads ``directory``, in eval mode.

    An adapter directory: the base (``base``, else the adapter config's ``base_model_name_or_path``)
    with ``PeftModel.from_pretrained`` on top — whose ``generation_config`` is the *base's*: peft does not
    read a ``generation_config.json`` saved beside the adapter (nor does ``AutoPeftModelForCausalLM``).
    The tokenizer comes from the directory when it has one, else from the base. A full directory:
    ``AutoModelForCausalLM.from_pretrained`` with ``dtype`` (transformers 5's default ``"auto"``: the
    dtype the config states).
    """
    path = _directory("directory", directory)
    if base is not None:
        _directory("base", base)
    if dtype != "auto" and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype={dtype!r} must be 'auto' or a torch dtype — it is what the weights are "
                        "loaded in — pass 'auto' (what transformers does by default) or e.g. torch.bfloat16.")
    info = saved_files(path)
    source = _base_source(path, base) if info["kind"] == "adapter" else None  # bad input fails first
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: after the checks

    from .quiet import no_progress_bars, quiet_libraries

    # the loaders' notices (peft's tied-layer warning, loading bars): the report measures what they warn of
    with quiet_libraries(python_warnings=False), no_progress_bars():
        if info["kind"] == "adapter":
            from peft import PeftModel

            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            model = PeftModel.from_pretrained(model, str(path))
            tokenizer = AutoTokenizer.from_pretrained(str(path) if info["has_tokenizer"] else source)
        else:
            if not info["has_tokenizer"]:
                raise ShipInputError(f"{str(path)!r} holds a full model but no tokenizer — a user cannot "
                                     "render a prompt for it — save the tokenizer there too "
                                     "(tokenizer.save_pretrained(directory)).")
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def lora_only_copy(adapter_dir, out_dir) -> Path:
    """Write ``adapter_dir`` to ``out_dir`` with only its LoRA matrices: what a loader that keeps LoRA
    weights and drops ``modules_to_save`` (fully trained embedding and head rows) serves. Returns
    ``out_dir``."""
    from safetensors.torch import load_file, save_file

    path = _directory("adapter_dir", adapter_dir)
    if saved_files(path)["kind"] != "adapter":
        raise ValueError(f"adapter_dir={str(path)!r} holds a full model, not an adapter — only an adapter "
                         "has LoRA matrices to keep — pass the directory trainer.save_model() wrote for a "
                         "LoRA run.")
    # never the adapter itself: the copy drops its modules_to_save rows, and they would be lost for good
    out = validate.new_directory("out_dir", out_dir, inputs=[path], what="the LoRA-only copy's files")
    out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(path / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if "lora_" in k}, str(out / "adapter_model.safetensors"))
    config = _read_json(path / "adapter_config.json")
    config["modules_to_save"] = None
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------
# Comparing with the trained model
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def _logits(model, batches: list[dict]) -> torch.Tensor:
    device = next(model.parameters()).device
    return torch.cat([model(input_ids=b["input_ids"].to(device),
                            attention_mask=b["attention_mask"].to(device)).logits.float().cpu()
                      for b in batches])


def logit_drift(reference, model, batches) -> dict:
    """How far ``model``'s next-token distribution is from ``reference``'s on ``batches`` (real tokens only):
    ``max_abs`` (max |Δlogit|) and ``kl`` (mean KL(reference ‖ model) in nats per token)."""
    validate.model("reference", reference)
    validate.model("model", model)
    batches = validate.batches("batches", batches, need=("input_ids", "attention_mask"))
    for b in batches:
        validate.ids_fit_model(reference, b["input_ids"], name="batches' input_ids")
        validate.ids_fit_model(model, b["input_ids"], name="batches' input_ids")
    return _drift(_logits(reference, batches), _logits(model, batches), batches)


def _drift(ref: torch.Tensor, got: torch.Tensor, batches: list[dict]) -> dict:
    real = torch.cat([b["attention_mask"] for b in batches]).bool()
    vocab = min(ref.shape[-1], got.shape[-1])  # a resized head: compare the shared vocabulary
    ref, got = ref[..., :vocab][real], got[..., :vocab][real]
    log_p, log_q = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return {"max_abs": float((ref - got).abs().max()), "kl": max(0.0, float(kl))}  # round-off can dip below 0


@torch.no_grad()
def _stops(model, tokenizer, prompts: list[str], eos_ids: list[int] | None,
           max_new_tokens: int) -> list[bool]:
    """Per prompt: did greedy generation end on a stop id before opening a new turn? ``eos_ids=None``: the
    model's own ``generation_config`` (what a user gets)."""
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    enc = enc.to(next(model.parameters()).device)
    extra = {} if eos_ids is None else {"eos_token_id": eos_ids}
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, **extra)
    stops = set(_eos_list(model.generation_config.eos_token_id if eos_ids is None else eos_ids))
    opener = _turn_opener(tokenizer)
    result = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in stops), None)
        result.append(end is not None and opener not in row[:end])
    return result


def _turn_opener(tokenizer) -> int:
    """The first special token of a rendered generation prompt (``<|im_start|>``): a reply that writes it
    invented a new turn."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                         add_generation_prompt=True)
    added = set(tokenizer.get_added_vocab().values())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return next((t for t in ids if t in added), -1)


def _rows_drift(trained, saved, ids: list[int]) -> float:
    """Max |Δ| over the input-embedding and output-head rows of ``ids`` (the special tokens)."""
    gap = 0.0
    for get in ("get_input_embeddings", "get_output_embeddings"):
        a, b = getattr(trained, get)(), getattr(saved, get)()
        if a is None or b is None:
            continue
        a, b = a.weight.detach().float(), b.weight.detach().float()
        ids_in = [i for i in ids if i < min(a.shape[0], b.shape[0])]
        if ids_in:
            gap = max(gap, float((a[ids_in] - b[ids_in]).abs().max()))
    return gap


def _dtype_of(model) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def ship_report(trained_model, trained_tokenizer, saved_dir, *, base=None,
                tolerance: float = LOGIT_TOLERANCE, n_prompts: int = 16, max_new_tokens: int = 40,
                conversations: list | None = None) -> list[ShipFinding]:
    """The ship check: load ``saved_dir`` as a user would (``load_saved``), compare it with the trained model.

    Five findings: ``logits`` (max |Δlogit| on probe chats <= ``tolerance``), ``stops`` (greedy replies with
    the saved ``generation_config`` stop on the end-of-turn token about as often as the trained model's
    replies do when told that token), ``chat_template`` (the one served equals the one trained with),
    ``token_rows`` (the special tokens' embedding and head rows as trained) and ``dtype`` (stated; a
    failure when it differs and moves the logits past the tolerance). The probe chats are the course's
    toy conversations unless ``conversations`` (a list of message lists, each with a user turn; the
    assistant turns are used for the logits) gives your own.
    """
    validate.model("trained_model", trained_model)
    validate.tokenizer("trained_tokenizer", trained_tokenizer)
    validate.number("tolerance", tolerance, positive=True,
                    why="it is the largest |Δlogit| a faithful copy shows")
    validate.positive_int("n_prompts", n_prompts, why="it is how many probe chats the check generates for")
    validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every probe generation")
    eot = end_of_turn_token(trained_tokenizer)
    saved, saved_tok = load_saved(saved_dir, base)
    info = saved_files(saved_dir)
    trained_model.eval()
    if conversations is None:
        conversations = make_messages("mixed", n_prompts, seed=PROBE_SEED)
    else:
        validate.non_empty("conversations", conversations, what="conversations (lists of messages)",
                           fix="pass e.g. make_messages('mixed', 16), or leave it out (the course's).")
        conversations = [validate.messages(f"conversations[{i}]", c) for i, c in enumerate(conversations)]
        n_prompts = len(conversations)
    batches = make_batches(trained_tokenizer, conversations, n_prompts)
    drift = _drift(_logits(trained_model, batches), _logits(saved, batches), batches)
    findings = [ShipFinding(
        "logits", drift["max_abs"] <= tolerance,
        f"max |Δlogit| {drift['max_abs']:.3g} (tolerance {tolerance:g}), "
        f"next-token KL {drift['kl']:.3g} nats",
        "the saved weights are not the trained ones: save the adapter with everything it trained "
        "(modules_to_save), or merge_and_unload() the trained model and save that, in the dtype you "
        "trained in")]

    eot_id = trained_tokenizer.convert_tokens_to_ids(eot)
    stop_ids = list(dict.fromkeys([eot_id, *_eos_list(trained_tokenizer.eos_token_id)]))
    prompts = [trained_tokenizer.apply_chat_template([m for m in c if m["role"] != "assistant"],
                                                     tokenize=False, add_generation_prompt=True)
               for c in conversations]
    trained_stops = _stops(trained_model, trained_tokenizer, prompts, stop_ids, max_new_tokens)
    trained_rate = sum(trained_stops) / n_prompts
    saved_rate = sum(_stops(saved, saved_tok, prompts, None, max_new_tokens)) / n_prompts
    served_eos = _eos_list(saved.generation_config.eos_token_id)
    where = ("the base's generation_config (peft does not read one saved beside the adapter)"
             if info["kind"] == "adapter" else "the directory's generation_config.json")
    findings.append(ShipFinding(
        "stops", saved_rate >= trained_rate - STOP_SLACK,
        f"saved model stops on {saved_rate:.2f} of {n_prompts} probe chats with {where}: eos_token_id "
        f"{served_eos} ({eot} = {eot_id} {'in' if eot_id in served_eos else 'NOT in'} it); the trained model "
        f"stops on {trained_rate:.2f} when told {eot}",
        f"ship a generation_config whose eos_token_id includes {eot}: merge_and_unload() the trained model "
        "and save_pretrained() it (its generation_config is written), or set the base's "
        "generation_config.eos_token_id; passing eos_token_id to generate() in your eval does not ship"))

    same = saved_tok.chat_template == trained_tokenizer.chat_template
    findings.append(ShipFinding(
        "chat_template", same,
        "the served chat template is the one trained with" if same else
        "the served chat template differs from the trained one ("
        f"{'the saved tokenizer' if info['has_tokenizer'] else 'none saved: the base one'} is served)",
        "save the tokenizer you trained with into the directory (tokenizer.save_pretrained(directory); "
        "trainer.save_model() does it)"))

    special = sorted(set(trained_tokenizer.get_added_vocab().values()))
    rows = _rows_drift(trained_model, saved, special)
    findings.append(ShipFinding(
        "token_rows", rows <= tolerance,
        f"max |Δ| of the {len(special)} special tokens' embedding and head rows: {rows:.3g}",
        "the special tokens' rows were trained (modules_to_save / trainable tokens) but not shipped: keep "
        "modules_to_save in the adapter and load it with peft, or merge and save the full model"))

    trained_dtype, saved_dtype = _dtype_of(trained_model), _dtype_of(saved)
    findings.append(ShipFinding(
        "dtype", trained_dtype == saved_dtype or drift["max_abs"] <= tolerance,
        f"trained in {trained_dtype}, served in {saved_dtype} (config dtype "
        f"{info['dtype'] or 'not stated: an adapter takes its base'})",
        f"save in the dtype you trained and evaluated in (model.to({trained_dtype}).save_pretrained(...)), "
        "or evaluate the saved dtype before shipping"))
    return findings


# ------------------------------------------------------------------------------------------------
# The command line: python -m course_utils.ship --trained DIR --saved DIR [--base DIR] [--json]
# ------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    """Exit 0 when the saved model is the trained one, 1 with what differs and the fix, 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.ship",
        description="Load a saved model as a user or server would and compare it with the trained one.")
    parser.add_argument("--trained", required=True, help="the model as trained: a full directory, or an "
                        "adapter directory (with --trained-base for its base)")
    parser.add_argument("--saved", required=True, help="what you ship: a full directory or an adapter")
    parser.add_argument("--base", help="the saved adapter's base (default: its adapter_config.json's)")
    parser.add_argument("--trained-base", help="the trained adapter's base (default: its adapter_config's)")
    parser.add_argument("--tolerance", type=float, default=LOGIT_TOLERANCE,
                        help="max |Δlogit| (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    from . import use_course_defaults

    use_course_defaults()
    try:  # the tolerance first: a NaN or negative one is refused before seconds of loading
        validate.number("--tolerance", args.tolerance, positive=True, why="it is the largest |Δlogit| a "
                        "faithful copy shows", fix="pass e.g. --tolerance 0.01, or leave it out")
        trained, tokenizer = load_saved(args.trained, args.trained_base)
        findings = ship_report(trained, tokenizer, args.saved, base=args.base, tolerance=args.tolerance)
    except (ShipInputError, TypeError, ValueError) as exc:  # the user's input: one line, never a traceback
        print(f"ship check: bad input: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=1))
    else:
        for f in findings:
            print(f)
    failed = [f.check for f in findings if not f.ok]
    print(f"ship check: {'healthy' if not failed else 'differs: ' + ', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------------
# The lesson's "what if" control
# ------------------------------------------------------------------------------------------------

_ROUTE_KEYS = ("files", "served_eos", "max_abs", "kl", "stop_rate")


def shipping_explorer(routes: dict):
    """What if you had shipped it another way? ``routes`` maps a label to what that way measured (a dict
    with ``files``, ``served_eos``, ``max_abs``, ``kl``, ``stop_rate``): one dropdown, one frame per way."""
    from .viz import what_if

    if not isinstance(routes, dict) or not routes:
        raise ValueError(f"routes must be a non-empty dict {{label: measurements}}, got "
                         f"{type(routes).__name__} — each entry is one way of saving — pass the dict the "
                         "lesson measured.")
    for label, r in routes.items():
        if not isinstance(r, dict) or not set(_ROUTE_KEYS) <= set(r):
            raise ValueError(f"routes[{label!r}] must be a dict with {list(_ROUTE_KEYS)} — the frame shows "
                             "them — measure each with saved_files, logit_drift and a stop rate.")

    def frame(route):
        r = routes[route]
        verdict = "ships the trained model" if r["max_abs"] <= LOGIT_TOLERANCE and r["stop_rate"] >= 0.5 \
            else "does NOT ship the trained model"
        return (f"{route}: {verdict}\n  files on disk : {', '.join(r['files'])}\n"
                f"  generate() stops on (served generation_config): {r['served_eos']}\n"
                f"  max |Δlogit| vs the trained model: {r['max_abs']:.3g} (tolerance {LOGIT_TOLERANCE:g}); "
                f"next-token KL {r['kl']:.3g} nats\n  stop rate with the served generation_config: "
                f"{r['stop_rate']:.2f}")

    return what_if(frame, {"route": list(routes)}, descriptions={"route": "how it was saved"}, width="620px")
