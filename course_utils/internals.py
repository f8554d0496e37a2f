"""The one place the course reaches into TRL's and transformers' private code.

Some lessons measure what a library does *inside* a training step, where no public API reaches: the
rows ``SFTTrainer`` would train (without loading a model), the order the Trainer feeds rows, the token
count it divides a step's loss by. Each such use is a function here, naming the private name it relies
on; ``PRIVATE_NAMES`` lists them with the versions this file mirrors, and ``tests/test_internals.py``
fails — naming this file — when an installed TRL or transformers no longer has one of them. Lessons
and the doctor call these functions, never the private names themselves.
"""

from __future__ import annotations

import types

import torch

from . import validate

MIRRORS = {"trl": "1.16.0", "transformers": "5.24.0"}  # the pinned versions this file was read against

# (class, private method, the parameters it takes): what tests/test_internals.py checks is still there
PRIVATE_NAMES = (
    ("trl.SFTTrainer", "_prepare_dataset",
     ("self", "dataset", "processing_class", "args", "packing", "formatting_func", "dataset_name")),
    ("transformers.Trainer", "_get_train_sampler", ("self", "train_dataset")),
    ("transformers.Trainer", "_get_num_items_in_batch", ("self", "batch_samples", "device")),
    ("transformers.debug_utils.DebugUnderflowOverflow", "_register_forward_hook", ("self", "module")),
)


def prepare_sft_dataset(dataset, tokenizer, args, *, chat_template=None, completion_only_loss=None):
    """The rows ``SFTTrainer`` would train — tokenized, labelled, truncated, packed — computed without a
    model: ``SFTTrainer._prepare_dataset`` with a stand-in for the trainer.

    Fully masked rows (no label left after truncation) are dropped **only without packing**: with
    ``args.packing=True`` TRL 1.16 packs them as they are (lesson 05 measures 40 of 256), so check the
    result with ``truncation.rows_without_targets``. On the text (non-conversational) path TRL tokenizes
    with the tokenizer's own special tokens whatever ``args.dataset_kwargs`` says: a BOS-adding tokenizer
    and text that already starts with BOS give two (lesson 04).

    In TRL 1.16 that method reads only ``_tokenizer``, ``chat_template`` and ``completion_only_loss``
    from the trainer (sft_trainer.py, ``_prepare_dataset``), so a namespace holding those stands in.
    ``args`` is an ``SFTConfig`` (or anything with its fields).
    """
    from trl import SFTTrainer

    validate.tokenizer("tokenizer", tokenizer)
    if not hasattr(args, "packing") or not hasattr(args, "max_length"):
        raise TypeError(f"args must be an SFTConfig, got {type(args).__name__} — TRL reads its packing, "
                        "max_length and other fields — pass SFTConfig(...).")
    if not hasattr(dataset, "map") or not len(dataset):
        raise ValueError(f"dataset must be a non-empty datasets.Dataset, got {type(dataset).__name__} — TRL "
                         "maps over its rows — pass Dataset.from_list(rows) with at least one row.")
    trainer = types.SimpleNamespace(_tokenizer=tokenizer, chat_template=chat_template,
                                    completion_only_loss=completion_only_loss)
    return SFTTrainer._prepare_dataset(trainer, dataset, tokenizer, args, args.packing, None, "train")


def sft_chat_template(tokenizer, assistant_only_loss: bool = True) -> str | None:
    """The ``chat_template`` ``SFTTrainer.__init__`` hands its data preparation (TRL 1.16, sft_trainer.py):
    ``None`` when it keeps the tokenizer's own — ``assistant_only_loss`` off, or the template already has
    ``{% generation %}`` markers — else TRL's training copy of the template, found by exact string match
    (``get_training_chat_template``). Raises ``ValueError`` where TRL ships none: SFTTrainer refuses then.
    The one copy of that decision (``prepare_sft_dataset``'s callers pass its result)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    validate.tokenizer("tokenizer", tokenizer)
    validate.flag("assistant_only_loss", assistant_only_loss, why="it is SFTConfig's switch")
    if not assistant_only_loss or has_generation_markers(tokenizer.chat_template):
        return None
    return get_training_chat_template(tokenizer)


def sft_completion_only(args, prompt_completion: bool) -> bool:
    """``completion_only_loss`` as ``SFTTrainer`` applies it: unset (``None``) grades only the completion of
    prompt-completion rows (``prompt_completion``) and every token of the others."""
    if not hasattr(args, "completion_only_loss"):
        raise TypeError(f"args must be an SFTConfig, got {type(args).__name__} — its completion_only_loss is "
                        "read — pass SFTConfig(...).")
    validate.flag("prompt_completion", prompt_completion, why="it says whether the rows are "
                  "prompt/completion")
    return prompt_completion if args.completion_only_loss is None else bool(args.completion_only_loss)


def feed_in_order(trainer) -> None:
    """Make ``trainer`` feed its training rows in dataset order (no shuffle): the Trainer builds its
    sampler in ``_get_train_sampler``; this instance's is replaced by a sequential one."""
    validate.trainer("trainer", trainer)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)


def count_items_hook(trainer_cls, on_count, *, count: bool = True):
    """A subclass of ``trainer_cls`` whose step-global token count (``Trainer._get_num_items_in_batch``:
    the ``num_items_in_batch`` every micro-batch's summed loss is divided by) is passed to
    ``on_count(value)``. ``count=False`` returns ``None`` instead: the pre-v4.46 path, where each
    micro-batch's mean loss is divided by the number of accumulation steps."""
    from transformers import Trainer

    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"trainer_cls must be a Trainer class, got {trainer_cls!r:.60} — the hook subclasses "
                        "it — pass e.g. trl.SFTTrainer (the class, not an instance).")
    validate.function("on_count", on_count)
    validate.flag("count", count, why="it switches the step-global token count (False: the pre-v4.46 path)")

    class CountingItems(trainer_cls):
        def _get_num_items_in_batch(self, batch_samples, device):
            value = super()._get_num_items_in_batch(batch_samples, device) if count else None
            on_count(value)
            return value

    return CountingItems


def removable_underflow_overflow(model, handles: list, **kwargs):
    """transformers' ``DebugUnderflowOverflow`` on ``model``, with each forward hook's handle appended to
    ``handles`` so the caller can remove them: the tool registers its hooks in the private
    ``_register_forward_hook`` and never removes them (debug_utils.py)."""
    from transformers.debug_utils import DebugUnderflowOverflow

    validate.model("model", model)
    if not isinstance(handles, list):
        raise TypeError(f"handles must be a list, got {type(handles).__name__} — the hooks' handles are "
                        "appended to it so that you can remove them — pass an empty list.")

    class Removable(DebugUnderflowOverflow):
        def _register_forward_hook(self, module):
            handles.append(module.register_forward_hook(self.forward_hook))

    return Removable(model, **kwargs)
