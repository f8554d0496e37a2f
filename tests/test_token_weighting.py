"""Lesson 07: the gradient oracle, the schemes, the checkers and the torchrun worker."""

import os

import pytest
import torch

from course_utils import load_course_model
from course_utils import token_weighting as tw
from course_utils.losses import count_supervised
from course_utils.train import token_losses

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_tok():
    return load_course_model(device="cpu")


# ---- the oracle -----------------------------------------------------------------------------------

def test_token_scheme_matches_full_batch_and_mean_does_not(model_tok):
    model, tok = model_tok
    mbs = tw.uneven_micro_batches(tok, k=3, batch_size=2, seed=5)
    counts = [count_supervised(b) for b in mbs]
    assert len(set(counts)) == 3, counts
    ref = tw.full_batch_grad(model, mbs, tok.pad_token_id)
    assert tw.relative_error(tw.accumulated_grad(model, mbs, "token"), ref) < 1e-5
    assert tw.relative_error(tw.accumulated_grad(model, mbs, "mean"), ref) > 1e-2


def test_equal_counts_make_both_schemes_exact(model_tok):
    model, tok = model_tok
    mbs = tw.equal_count_micro_batches(tok, k=3, batch_size=2)
    assert len({count_supervised(b) for b in mbs}) == 1
    assert len({b["input_ids"].shape[1] for b in mbs}) > 1, "prompts should differ in length"
    ref = tw.full_batch_grad(model, mbs, tok.pad_token_id)
    for scheme in tw.SCHEMES:
        assert tw.relative_error(tw.accumulated_grad(model, mbs, scheme), ref) < 1e-5


def test_merge_keeps_every_supervised_token(model_tok):
    _, tok = model_tok
    mbs = tw.uneven_micro_batches(tok, k=2, batch_size=2)
    big = tw.merge_micro_batches(mbs, tok.pad_token_id)
    assert big["input_ids"].shape[0] == 4
    assert count_supervised(big) == sum(count_supervised(b) for b in mbs)


def test_token_weights_sum_to_one():
    for scheme in tw.SCHEMES:
        counts = [3, 9, 27]
        weights = tw.token_weights(counts, scheme)
        assert abs(sum(w * n for w, n in zip(weights, counts)) - 1) < 1e-12


# ---- bad input: what / why / fix ------------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: tw.token_weights([3, 4], "sum"), "is not one of"),
    (lambda: tw.token_weights([3, 0], "mean"), "n_tokens"),
    (lambda: tw.relative_error(torch.ones(3), torch.zeros(3)), "non-zero reference"),
    (lambda: tw.run_ddp_grad(batch_size=0), "batch_size"),
    (lambda: tw.run_ddp_grad(seed=-1), "seed"),
    (lambda: tw.accumulation_trace(-1), "seed"),
    (lambda: tw.accumulated_grad(None, [], "token"), "must be a torch model"),
    (lambda: tw.merge_micro_batches([{"input_ids": torch.ones(1, 2, dtype=torch.long),
                                      "labels": torch.ones(1, 2, dtype=torch.long),
                                      "attention_mask": torch.zeros(1, 2, dtype=torch.long)}]), "no real "
                                      "token"),
    (lambda: tw.relative_error(torch.zeros(3), torch.ones(4)), "same model"),
    (lambda: tw.multi_turn_conversations(4, max_turns=0), "max_turns"),
    (lambda: tw.run_ddp_grad(nproc=0), "nproc"),
])
def test_bad_input_raises_value_error(call, words):
    with pytest.raises((ValueError, TypeError), match=words) as info:
        call()
    assert " — " in str(info.value), "the message should say what, why and how to fix"


def test_worker_refuses_to_run_outside_torchrun(monkeypatch):
    from course_utils import ddp_grad

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        ddp_grad.main(["--out", "/tmp/never.pt"])


# ---- exercise 1 -----------------------------------------------------------------------------------

def test_merge_handles_left_padded_micro_batches(model_tok):
    """issue 21: a left-padded micro-batch used to keep its pads and drop real tokens."""
    from course_utils.padding import collate_padded

    model, tok = model_tok
    right = tw.uneven_micro_batches(tok, k=2, batch_size=2, seed=4)
    rows = [[{"input_ids": ids[m.bool()].tolist(), "labels": lab[m.bool()].tolist()}
             for ids, lab, m in zip(b["input_ids"], b["labels"], b["attention_mask"])] for b in right]
    left = [collate_padded(r, tok.pad_token_id, "left") for r in rows]
    merged_left = tw.merge_micro_batches(left, tok.pad_token_id)
    merged_right = tw.merge_micro_batches(right, tok.pad_token_id)
    assert all(torch.equal(merged_left[k], merged_right[k]) for k in merged_right)


# ---- exercise checkers ----------------------------------------------------------------------------

def _stub(*args, **kwargs):
    raise NotImplementedError


def _reference(name):
    from course_utils.answers import lesson07
    return getattr(lesson07, name)


def _diagnose_by_ratios(trace):
    """A second correct diagnosis: compares each row's weight with 1/N instead of with each other."""
    import math

    from course_utils.checks import Diagnosis

    rows, world, k = trace["rows"], trace["world_size"], trace["accum_steps"]
    bad = [r for r in rows if not math.isfinite(r["backward_loss"])]
    if bad:
        return Diagnosis("empty_micro_batch", bad[0]["micro_step"])
    n_total = sum(r["n_tokens"] for r in rows)
    ratio = [r["backward_loss"] / r["summed_loss"] / world * n_total for r in rows]  # 1.0 when healthy
    if all(abs(x - 1) < 1e-6 for x in ratio):
        return Diagnosis("token_weighted", None)
    if all(abs(x - ratio[0]) < 1e-6 * ratio[0] for x in ratio):
        return Diagnosis("missing_division_by_k", k)
    worst = rows[ratio.index(max(ratio))]
    return Diagnosis("per_rank_mean", worst["rank"]) if world > 1 else Diagnosis("per_micro_batch_mean",
                                                                                  worst["micro_step"])


def _ignores_world_size(trace):
    """Misconception: forgets DDP's average, so a correct multi-rank step looks W times too large."""
    from course_utils.checks import Diagnosis

    truth = _reference("diagnose_accumulation_trace")(trace)
    if truth.cause == "token_weighted" and trace["world_size"] > 1:
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _ranks_are_micro_batches(trace):
    """Misconception: a DDP step is just accumulation, so per-rank means are 'per_micro_batch_mean'."""
    from course_utils.checks import Diagnosis

    truth = _reference("diagnose_accumulation_trace")(trace)
    if truth.cause == "per_rank_mean":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _unequal_blamed_on_k(trace):
    """Misconception: any too-large step is the missing / K of lesson 01."""
    from course_utils.checks import Diagnosis

    truth = _reference("diagnose_accumulation_trace")(trace)
    if truth.cause == "missing_division_by_k":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _sequence_weighted_loop(model, micro_batches):
    """A second correct fix: a loop over rows, each row's mean / S."""
    import torch.nn.functional as F

    rows = [(b, r) for b in micro_batches for r in range(len(b["labels"]))
            if (b["labels"][r, 1:] != -100).any()]
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = 0.0
        for r in range(len(b["labels"])):
            labels = b["labels"][r, 1:]
            if (labels != -100).any():
                loss = loss + F.cross_entropy(logits[r, :-1].float(), labels, ignore_index=-100)
        (loss / len(rows)).backward()


def _token_weighted(model, micro_batches):
    n = sum(count_supervised(b) for b in micro_batches)
    for b in micro_batches:
        summed, _ = token_losses(model, b)
        (summed / n).backward()


def _per_micro_batch_sequence_mean(model, micro_batches):
    import torch.nn.functional as F

    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        keep = n > 0
        ((nll.sum(1)[keep] / n[keep]).mean() / len(micro_batches)).backward()


def _counts_empty_rows(model, micro_batches):
    import torch.nn.functional as F

    s = sum(len(b["labels"]) for b in micro_batches)
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        (torch.where(n > 0, nll.sum(1) / n.clamp(min=1), 0.0).sum() / s).backward()


def _no_backward(model, micro_batches):
    return None


CORRECT = [
    (tw.check_trace_diagnosis, lambda: _reference("diagnose_accumulation_trace")),
    (tw.check_trace_diagnosis, lambda: _diagnose_by_ratios),
    (tw.check_sequence_weighted, lambda: _reference("accumulate_sequence_weighted")),
    (tw.check_sequence_weighted, lambda: _sequence_weighted_loop),
]


@pytest.mark.parametrize("checker, answer", CORRECT)
def test_checker_accepts_correct_answers(checker, answer, capsys):
    assert checker(answer())


@pytest.mark.parametrize("checker", [tw.check_trace_diagnosis, tw.check_sequence_weighted])
def test_checker_rejects_the_stub(checker, capsys):
    result = checker(_stub)
    assert not result and "not implemented" in result.message


WRONG = [
    (tw.check_trace_diagnosis, _ignores_world_size, "this step is the big batch"),
    (tw.check_trace_diagnosis, _ranks_are_micro_batches, "DDP averages the ranks' means"),
    (tw.check_trace_diagnosis, _unequal_blamed_on_k, "the step counts K times"),
    (tw.check_sequence_weighted, _token_weighted, "long answers dominate"),
    (tw.check_sequence_weighted, _per_micro_batch_sequence_mean, "a sequence in a small micro-batch "
                                                                 "counts more"),
    (tw.check_sequence_weighted, _counts_empty_rows, "right direction"),
    (tw.check_sequence_weighted, _no_backward, ".backward()"),
]


@pytest.mark.parametrize("checker, wrong, phrase", WRONG)
def test_checker_names_the_misconception(checker, wrong, phrase, capsys):
    result = checker(wrong)
    assert not result and phrase in result.message, result.message


def test_traces_cover_every_cause():
    assert {tw.accumulation_trace(s)[1].cause for s in range(10)} == set(tw.TRACE_CAUSES)


# ---- two processes --------------------------------------------------------------------------------

def test_worker_in_one_process_matches_full_batch(model_tok, monkeypatch, tmp_path):
    """The worker's code path with world_size=1 (the notebook runs it under torchrun with 2)."""
    import socket

    from course_utils import ddp_grad

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "grads.pt"
    ddp_grad.main(["--out", str(out), "--seed", "3", "--batch-size", "2"])
    result = torch.load(out)
    model, tok = model_tok
    ref = tw.full_batch_grad(model, tw.uneven_micro_batches(tok, k=1, batch_size=2, seed=3), tok.pad_token_id)
    assert result["world_size"] == 1 and len(result["n_tokens"]) == 1
    for scheme in ("rank_mean", "global_count"):  # one rank: both schemes are the full batch
        assert tw.relative_error(result[scheme], ref) < 1e-5


def test_accumulation_explorer_is_exact_at_k1_and_token_weighted_everywhere(course):
    model, tokenizer = course
    control = tw.accumulation_explorer(model, tokenizer, seed=0, n_chats=4)
    assert "K (micro-batches)" in [c.description for c in control.children]
    assert "supervised tokens per micro-batch" in control._repr_mimebundle_()["text/plain"]

    def errors():
        mean, token = (float(x) for x in control.text.split("÷ K ")[1].split(", token-weighted "))
        return mean, token

    control.children[0].value = 1
    assert errors() == (0.0, 0.0), "one micro-batch is the big batch"
    control.children[0].value = 4
    mean, token = errors()
    assert token < 1e-5 < 1e-2 < mean, "four single-chat micro-batches: only the token-weighted sum is exact"
