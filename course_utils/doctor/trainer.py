"""The doctor's check of a practitioner's own trainer class :
lesson 01's split test, run on that class.

A ``compute_loss`` written by hand often takes the mean over its own micro-batch and ignores
``num_items_in_batch``; with gradient accumulation the Trainer then averages K per-micro-batch means
instead of dividing the step's summed loss by its graded tokens, and the gradient is no longer the
batch's (lesson 01). The split test needs no knowledge of the code: the same 8 rows as one batch and
as 4 micro-batches of 2 must give the same first-step gradient. Stock ``SFTTrainer`` is run beside
the user's class as the control: its difference between the two splits is the run's own round-off, and
the user's class is judged against a multiple of it, not against a constant.

On W processes a second test runs (lesson 07): the Trainer's ``num_items_in_batch`` is then the count of all
W ranks (``average_tokens_across_devices``, the default) and DDP averages the ranks' gradients, so a loss
divided by that count must be multiplied by W — ``SFTTrainer.compute_loss`` does it. The test calls the
class's ``compute_loss`` and stock SFTTrainer's on the same micro-batch with the count of W equal ranks,
the trainer's accelerator reporting W processes (a stand-in on the trainer, nothing global is changed).
"""

from __future__ import annotations

import copy
import functools
import importlib
import warnings

from .report import Finding

# A room of the doctor, not an API: its names serve the package; users import ``course_utils.doctor``
__all__ = []

SPLITS = (1, 4)  # one batch of 8 rows, and 4 micro-batches of 2: the same rows in the same step
ROWS = 8
ROUND_OFF_FACTOR = 100.0  # a class is wrong when its split gap is this many times stock SFTTrainer's
ROUND_OFF_FLOOR = 1e-4  # the smallest relative gap judged (float32 sums differ by ~1e-7 here)


def import_trainer(spec):
    """The class ``spec`` names (``"package.module:ClassName"``) or ``spec`` itself when it is a class;
    ``ValueError`` with what/why/fix when it cannot be imported or is not a ``trl.SFTTrainer``."""
    from trl import SFTTrainer

    if isinstance(spec, str):
        module_name, _, name = spec.partition(":")
        if not (module_name and name):
            raise ValueError(f"trainer={spec!r} is not 'module:Class' — the doctor imports your class to run "
                             "it — pass e.g. --trainer my_training.trainers:MyTrainer.")
        try:
            spec = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"trainer={spec!r} could not be imported ({type(exc).__name__}: {exc}) — the "
                             "doctor runs your class — run the doctor from the directory (or PYTHONPATH) "
                             f"where `import {module_name}` works.") from None
    if not (isinstance(spec, type) and issubclass(spec, SFTTrainer)):
        raise ValueError(f"trainer={spec!r} is not a subclass of trl.SFTTrainer — the split test builds it "
                         "like SFTTrainer — pass the SFTTrainer subclass your script trains with.")
    return spec


def _first_grad_norm(trainer_cls, split: int) -> float:
    """The gradient norm ``trainer_cls`` logs for its first step on the course model: ``ROWS`` rows as
    ``split`` micro-batches (the same rows in every split: the same seeded sampler)."""
    from ..data import make_chat_dataset
    from ..model import load_course_model
    from ..training import logged, make_sft_trainer

    model, tokenizer = load_course_model()
    # mixed lengths: micro-batches with different graded-token counts are what tells the two losses apart
    dataset = make_chat_dataset("mixed", n=ROWS, seed=11)
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, trainer_cls=trainer_cls, max_steps=1,
                               gradient_accumulation_steps=split, per_device_train_batch_size=ROWS // split,
                               max_grad_norm=1e9, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return logged(trainer, "grad_norm")[0]


@functools.cache  # a class's gap is a property of its code: measured once per process
def _split_gaps(trainer_cls) -> tuple[float, float]:
    """``(the class's relative gap, stock SFTTrainer's)`` between the first-step gradient norms of one
    batch and of ``SPLITS[1]`` micro-batches of the same rows."""
    from trl import SFTTrainer

    def gap(cls):
        one, many = (_first_grad_norm(cls, k) for k in SPLITS)
        return abs(many - one) / max(abs(one), 1e-30)

    return gap(trainer_cls), gap(SFTTrainer)


class _Ranks:
    """The trainer's accelerator, reporting ``num_processes`` ranks; everything else is the real one's."""

    def __init__(self, accelerator, num_processes: int):
        self._accelerator, self.num_processes = accelerator, num_processes

    def __getattr__(self, name):
        return getattr(self._accelerator, name)


@functools.cache  # a property of the class's code and W: measured once per process
def _rank_ratio(trainer_cls, num_processes: int) -> float:
    """The class's loss ÷ stock SFTTrainer's on one micro-batch whose ``num_items_in_batch`` is the count
    of ``num_processes`` equal ranks; 1.0 when the class scales by the number of processes as TRL does."""
    import torch
    from trl import SFTTrainer

    from ..data import make_chat_dataset, n_graded
    from ..model import load_course_model
    from ..training import make_sft_trainer

    model, tokenizer = load_course_model()
    dataset = make_chat_dataset("mixed", n=ROWS, seed=11)
    losses = []
    for cls in (trainer_cls, SFTTrainer):
        trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, trainer_cls=cls, max_steps=1,
                                   per_device_train_batch_size=ROWS // SPLITS[1], progress=False)
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        trainer.accelerator = _Ranks(trainer.accelerator, num_processes)  # this trainer only
        count = torch.tensor(n_graded(batch["labels"]) * num_processes)  # what the gather would give
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=count)
        losses.append(float(loss[0] if isinstance(loss, tuple) else loss))
    return losses[0] / losses[1]


def _rank_findings(trainer_cls, num_processes: int) -> list[Finding]:
    """On several processes: does the class multiply its count-divided loss by W, as SFTTrainer does?"""
    ratio = _rank_ratio(trainer_cls, num_processes)
    if abs(ratio - 1.0) <= ROUND_OFF_FLOOR:
        return []
    name = trainer_cls.__name__
    return [Finding("error", "trainer-accumulation",
                    f"{name}'s loss on {num_processes} processes is {ratio:.3g}× SFTTrainer's",
                    f"one micro-batch, num_items_in_batch = the graded tokens of {num_processes} equal ranks "
                    f"(average_tokens_across_devices): {name} returns {ratio:.3g}× SFTTrainer's loss; DDP "
                    f"then averages the ranks' gradients, so the step's gradient is {ratio:.3g}× the batch's",
                    "multiply a loss divided by num_items_in_batch by self.accelerator.num_processes, as "
                    "SFTTrainer.compute_loss does (lesson 07) — or return super().compute_loss(model, "
                    "inputs, return_outputs, num_items_in_batch)", "07")]


def trainer_findings(trainer_cls, args, num_processes: int) -> list[Finding]:
    """Your trainer class under lesson 01's split test (``_split_gaps``): the same rows as one batch and
    as micro-batches must give the same gradient, as they do with stock ``SFTTrainer``; on several
    processes, also the ranks test (``_rank_ratio``)."""
    if trainer_cls is None:
        return []
    if num_processes > 1:
        ranks = _rank_findings(trainer_cls, num_processes)
    mine, stock = _split_gaps(trainer_cls)
    limit = max(stock * ROUND_OFF_FACTOR, ROUND_OFF_FLOOR)
    name, (one, many) = trainer_cls.__name__, SPLITS
    test = (f"split test (lesson 01) on the course model: {ROWS} rows as {one} batch and as {many} "
            f"micro-batches give first-step gradient norms {mine:.2%} apart (stock SFTTrainer: {stock:.1e})")
    if mine <= limit:
        if num_processes > 1 and ranks:
            return ranks
        return [Finding("info", "trainer-accumulation",
                        f"{name} weights the tokens of a step as SFTTrainer does", test
                        + (f"; on {num_processes} processes its loss equals SFTTrainer's" if num_processes > 1
                           else ""), "nothing to fix", "01")]
    accumulates = args.gradient_accumulation_steps > 1 or num_processes > 1
    return [Finding("error" if accumulates else "warning", "trainer-accumulation",
                    f"{name}'s gradient depends on how a batch is split into micro-batches",
                    f"{test}; gradient_accumulation_steps={args.gradient_accumulation_steps} on "
                    f"{num_processes} process(es): "
                    + ("the run's gradient is not the batch's" if accumulates else
                       "harmless until you accumulate or add processes"),
                    "in compute_loss, sum the token losses and divide by num_items_in_batch (the step's "
                    "graded tokens) when the Trainer passes it"
                    + (", times self.accelerator.num_processes on several processes" if num_processes > 1
                       else "")
                    + " — or return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)",
                    "01")]
