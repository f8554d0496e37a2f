"""``diagnose``: read and check the inputs (``inputs``), build what TRL would train (``trl_view``), run every
check (``checks``, ``lengths``, ``precision``, ``reasoning``, ``trainer``) each through ``report.guarded``,
and return the ``Report``.
"""

from __future__ import annotations

import types
from pathlib import Path

from .. import internals
from ..quiet import no_progress_bars
from . import architecture, checks, data_checks, inputs, lengths, precision, reasoning, trainer, trl_view
from .inputs import SAMPLE_ROWS, DoctorInputError
from .report import SAMPLED, SEVERITIES, Finding, Report, could_not_check, guarded
from .trainer import import_trainer

# What this file offers users (re-exported by ``course_utils.doctor``); its other names serve the package
__all__ = ["SAMPLE_ROWS", "diagnose"]


def diagnose(model, data, config=None, *, max_length: int | None = None, forward: bool = True,
             peft_config=None, num_processes: int = 1, max_load_gb: float = precision.LOAD_LIMIT_GB,
             sample: int | None = SAMPLE_ROWS, seed: int = 0, trainer=None) -> Report:
    """Check a fine-tuning set-up; return a ``Report`` (a list of ``Finding``s, errors first).

    ``model``: a local directory, a hub id (offline: from the cache) or a ``(model, tokenizer)``
    pair; ``data``: a JSONL path or a list of rows (``messages`` or ``prompt``/``completion``);
    ``config``: a dict or JSON path of SFTConfig fields; ``max_length`` overrides the config's;
    ``peft_config``: the ``LoraConfig`` (or a dict / JSON path of its fields) you pass to
    ``SFTTrainer(peft_config=...)``; ``num_processes``: the processes training runs on (torchrun's
    ``--nproc-per-node`` x nodes), which share each optimizer step; ``max_load_gb``: the largest checkpoint
    the fp16 check loads; ``sample``: how many rows to check, a uniform random draw seeded by ``seed``
    when the data holds more (``None``: every row; a report on a sample quotes each rate with its 95 %
    interval for the whole data); ``trainer``: your own ``SFTTrainer`` subclass (or ``"module:Class"``),
    whose loss lesson 01's split test checks under gradient accumulation. ``forward=False`` skips loading
    weights (the fp16 check then says it did not measure). Raises ``DoctorInputError`` on bad input (a
    set-up the doctor would have to guess at), before any measurement: the cheap checks (files, rows,
    arguments) first, then the configs.

    Example (the course model, eight rows)::

        from course_utils.doctor import diagnose
        rows = [{"prompt": f"Q: {a} plus {a}?", "completion": f" {2 * a}."} for a in range(8)]
        report = diagnose("tiny-qwen", rows, {"learning_rate": 2e-5})
        print(report.exit_code)  # 0: no error
    """
    inputs.validate_options(forward=forward, num_processes=num_processes, max_load_gb=max_load_gb,
                            sample=sample, seed=seed)
    max_length = inputs.validate_max_length(max_length)
    config = inputs.read_config(config)
    rows, total = inputs.read_rows(data, sample, seed)
    try:
        trainer_cls = None if trainer is None else import_trainer(trainer)
    except ValueError as exc:
        raise DoctorInputError(str(exc)) from None
    inputs.validate_model(model)
    inputs.validate_config(config)
    peft = inputs.lora_setup(config, inputs.read_peft_config(peft_config))
    source, model_obj, tokenizer = inputs.model_source_and_tokenizer(model)
    args, flags = trl_view.sft_args(config, max_length)
    form = inputs.row_form(rows)
    if isinstance(data, (str, Path)) and Path(data).is_dir():  # a folder: the file it loads, or its rows
        files = inputs.folder_files(Path(data))[0]
        data = str(files[0][0]) if len(files) == 1 and files[0][1] == "json" else list(rows)
    setup = types.SimpleNamespace(data=data, config=config, precision=flags, source=source,
                                  model=model_obj, forward=forward, peft=peft, num_processes=num_processes,
                                  max_load_gb=max_load_gb, trainer=trainer_cls)
    sampled = total if len(rows) < total else None
    token = SAMPLED.set(sampled)
    try:
        with no_progress_bars():
            report = _run_checks(rows, form, tokenizer, args, setup)
        report = Report(sorted(report + rows.findings, key=lambda f: SEVERITIES.index(f.severity)))
    finally:
        SAMPLED.reset(token)
    if sampled:
        report.append(Finding("info", "sample", f"checked a random sample of {len(rows):,} of {total:,} rows "
                              f"(seed {seed})", "counts and row ids are the sample's, each rate quoted "
                              "with its 95 % interval for all the rows — but copies and contradictions, "
                              "counted over every row of the file",
                              "--all (sample=None) checks every row: exact counts, in time proportional to "
                              "the rows (README: the doctor at scale)"))
    return report


def _run_checks(rows, form, tokenizer, args, setup) -> Report:
    tokenizer, findings = trl_view.apply_chat_template_path(tokenizer, args)
    try:
        tokenizer, setup_findings = trl_view.trl_tokenizer(tokenizer, args)
    except Exception as exc:  # noqa: BLE001 — measure with the tokenizer as given, and say so
        setup_findings = could_not_check("special-token-unknown", exc)
    findings += setup_findings
    findings += guarded("no-assistant-turns", checks.assistant_turn_findings, rows, form, args)
    data_at = len(findings)  # the data checks' place in the report: they run while TRL prepares the rows
    try:
        template_findings, chat_template, trainable = checks.template_findings(tokenizer, args, form, rows)
    except Exception as exc:  # noqa: BLE001 — a check that cannot run is a finding, not a traceback
        template_findings, chat_template, trainable = could_not_check("template", exc), None, False
    findings += template_findings
    completion_only = internals.sft_completion_only(args, form.startswith("prompt_completion"))
    preparation = kept = None
    # rows without an answer are reported above; the rest is measured without them (TRL would refuse them)
    skip = set(checks.rows_without_answer(rows, form)) if args.assistant_only_loss else set()
    try:
        dataset, load_findings = trl_view.trl_dataset(setup.data, rows)
    except Exception as exc:  # noqa: BLE001
        dataset, load_findings = None, could_not_check("data-unloadable", exc)
    findings += load_findings
    if trainable and dataset is not None and len(skip) < len(rows):
        try:
            kept = dataset.select([i for i, r in enumerate(dataset["_doctor_row"]) if r not in skip])
            # started before the data checks, read after them: on many rows TRL tokenizes them on the
            # other cores meanwhile (trl_view.Preparation), each shard also finding the rows TRL's
            # truncation drops
            dropping = lengths.shard_dropped_rows(tokenizer, args, chat_template, completion_only)
            preparation = trl_view.Preparation(tokenizer, kept, args, chat_template, completion_only,
                                               max_length=None, packing=False, then=dropping)
        except Exception as exc:  # noqa: BLE001
            findings += could_not_check("trl-preparation", exc)
    # rows without an answer are no-assistant-turns' (its fix names the roles): not reported twice
    findings[data_at:data_at] = guarded("data-checks", data_checks.data_findings, rows, form, tokenizer,
                                        checks.rows_without_answer(rows, form))
    prepared, failed = _prepared(preparation, kept, tokenizer, chat_template)
    findings += failed
    # the stop the rows end with: the template's end of turn for chats; for plain text and prompt/completion
    # text, the tokenizer.eos_token TRL appends to each row ("Adding EOS")
    conversational = form in ("messages", "prompt_completion") or (  # or rendered chats:
        form == "tokenized" and checks.rows_hold(rows, trl_view.end_of_turn_or_none(tokenizer)))
    eot = trl_view.end_of_turn_or_none(tokenizer) if conversational else tokenizer.eos_token_id
    loaded = precision.loaded_model(setup)
    try:
        gen_eos = trl_view.generation_eos_ids(setup.source, loaded[0])
    except Exception as exc:  # noqa: BLE001
        gen_eos, findings = None, findings + could_not_check("eos-mismatch", exc)
    findings += guarded("stop-token-untrained", checks.stop_token_findings, tokenizer, prepared, eot, args,
                        chat_template)
    if gen_eos is not None:
        findings += guarded("eos-mismatch", checks.eos_findings, tokenizer, eot, gen_eos, args,
                            conversational, setup.peft)
    findings += guarded("pad-is-eos", checks.pad_eos_findings, tokenizer, prepared, eot, args)
    masked = args.assistant_only_loss or (form.startswith("prompt_completion") and completion_only)
    stop_ids = {i for i in (eot, tokenizer.eos_token_id, *(gen_eos or [])) if i is not None}
    if form in ("messages", "prompt_completion"):  # chats: what the template renders of each message
        findings += reasoning.reasoning_and_tool_findings(kept, prepared, tokenizer, chat_template, masked,
                                                          stop_ids)
    shards = preparation.after if preparation is not None else None  # each shard's dropped rows, if sharded
    dropped = None if shards is None else sorted(r for part in shards for r in part)
    findings += guarded("truncation", lengths.truncation_findings, prepared, tokenizer, args, chat_template,
                        completion_only, setup.num_processes, dropped)
    findings += guarded("packing", lengths.packing_findings, prepared, tokenizer, args, chat_template,
                        completion_only)
    findings += guarded("precision-and-learning-rate", precision.precision_and_lr_findings, setup.config,
                        setup.precision, args, loaded if setup.forward else (None, "forward=False"),
                        tokenizer, prepared, setup.peft)
    findings += guarded("load-dtype", precision.load_dtype_findings, setup.config, setup.precision,
                        setup.source, setup.model, setup.peft)
    findings += guarded("double-bos", checks.double_bos_findings, tokenizer, prepared)
    if form == "tokenized" and "labels" in rows[0]:
        findings += guarded("labels-misaligned", checks.label_alignment_findings, prepared)
    findings += guarded("right-padding", checks.padding_side_findings, tokenizer)
    findings += guarded("trainer-accumulation", trainer.trainer_findings, setup.trainer, args,
                        setup.num_processes)
    findings += guarded("lora-coverage", architecture.lora_coverage_findings, setup)
    findings += guarded("packing-leak", architecture.packing_leak_findings, setup, args)
    findings += guarded("loss-count-ignored", architecture.loss_count_findings, setup, args)
    return Report(sorted(findings, key=lambda f: SEVERITIES.index(f.severity)))


def _prepared(preparation, kept, tokenizer, chat_template) -> tuple:
    """``(TRL's prepared rows, [])``, or ``(None, the findings of a preparation that fails)``."""
    from jinja2 import TemplateError

    if preparation is None:
        return None, []
    try:
        return preparation.result(), []
    except (TemplateError, TypeError) as exc:  # a template that raises on a row: name the row
        return None, (reasoning.template_error_findings(kept, tokenizer, chat_template, exc)
                      or [_preparation_failed(exc)])
    except (RuntimeError, ValueError, KeyError) as exc:  # TRL's own refusal is the finding
        return None, [_preparation_failed(exc)]
    except Exception as exc:  # noqa: BLE001
        return None, could_not_check("trl-preparation", exc)


def _preparation_failed(exc: Exception) -> Finding:
    return Finding("error", "trl-preparation", "TRL's dataset preparation fails on these rows",
                   f"{type(exc).__name__}: {str(exc)[:200]}",
                   "fix the rows or the template it names; SFTTrainer would stop here", "04")
