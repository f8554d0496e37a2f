"""Lesson 07: the gradient oracle, the schemes, the checkers and the torchrun worker."""

import os

import pytest
import torch

from course_utils import load_course_model
from course_utils import token_weighting as tw
from course_utils.train import token_losses

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_tok():
    return load_course_model(device="cpu")


# ---- the oracle -----------------------------------------------------------------------------------

def test_token_scheme_matches_full_batch_and_mean_does_not(model_tok):
    model, tok = model_tok
    mbs = tw.uneven_micro_batches(tok, k=3, batch_size=2, seed=5)
    counts = [tw.count_supervised(b) for b in mbs]
    assert len(set(counts)) == 3, counts
    ref = tw.full_batch_grad(model, mbs, tok.pad_token_id)
    assert tw.relative_error(tw.accumulated_grad(model, mbs, "token"), ref) < 1e-5
    assert tw.relative_error(tw.accumulated_grad(model, mbs, "mean"), ref) > 1e-2


def test_equal_counts_make_both_schemes_exact(model_tok):
    model, tok = model_tok
    mbs = tw.equal_count_micro_batches(tok, k=3, batch_size=2)
    assert len({tw.count_supervised(b) for b in mbs}) == 1
    assert len({b["input_ids"].shape[1] for b in mbs}) > 1, "prompts should differ in length"
    ref = tw.full_batch_grad(model, mbs, tok.pad_token_id)
    for scheme in tw.SCHEMES:
        assert tw.relative_error(tw.accumulated_grad(model, mbs, scheme), ref) < 1e-5


def test_merge_keeps_every_supervised_token(model_tok):
    _, tok = model_tok
    mbs = tw.uneven_micro_batches(tok, k=2, batch_size=2)
    big = tw.merge_micro_batches(mbs, tok.pad_token_id)
    assert big["input_ids"].shape[0] == 4
    assert tw.count_supervised(big) == sum(tw.count_supervised(b) for b in mbs)


def test_token_weights_sum_to_one():
    for scheme in tw.SCHEMES:
        counts = [3, 9, 27]
        weights = tw.token_weights(counts, scheme)
        assert abs(sum(w * n for w, n in zip(weights, counts)) - 1) < 1e-12


# ---- bad input: what / why / fix ------------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: tw.token_weights([3, 4], "sum"), "is not one of"),
    (lambda: tw.token_weights([3, 0], "mean"), "positive ints"),
    (lambda: tw.accumulated_grad(None, [], "token"), "non-empty list of batches"),
    (lambda: tw.relative_error(torch.zeros(3), torch.ones(4)), "same model"),
    (lambda: tw.multi_turn_conversations(4, max_turns=0), "max_turns"),
    (lambda: tw.run_ddp_grad(nproc=0), "nproc"),
])
def test_bad_input_raises_value_error(call, words):
    with pytest.raises(ValueError, match=words) as info:
        call()
    assert " — " in str(info.value), "the message should say what, why and how to fix"


def test_worker_refuses_to_run_outside_torchrun(monkeypatch):
    from course_utils import ddp_grad

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        ddp_grad.main(["--out", "/tmp/never.pt"])


# ---- exercise 1 -----------------------------------------------------------------------------------

def test_check_token_weights_accepts_reference(capsys):
    assert tw.check_token_weights(tw.token_weights)
    assert "✅" in capsys.readouterr().out


def test_check_token_weights_rejects_stub():
    def stub(n_tokens, scheme):
        raise NotImplementedError

    result = tw.check_token_weights(stub)
    assert not result and "not implemented" in result.message


def test_check_token_weights_names_missing_division_by_k():
    result = tw.check_token_weights(lambda n_tokens, scheme: [1 / n for n in n_tokens])
    assert not result and "without ÷K" in result.message


def test_check_token_weights_names_swapped_schemes():
    result = tw.check_token_weights(lambda n, s: tw.token_weights(n, "token" if s == "mean" else "mean"))
    assert not result and "1/(K·nᵢ)" in result.message


# ---- exercise 2 -----------------------------------------------------------------------------------

def _reference(model, micro_batches):
    total = sum(tw.count_supervised(b) for b in micro_batches)
    for batch in micro_batches:
        summed, _ = token_losses(model, batch)
        (summed / total).backward()


def _per_micro_batch_mean(model, micro_batches):
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / max(n, 1) / len(micro_batches)).backward()


def _hand_mean_rescaled(model, micro_batches):
    total = sum(tw.count_supervised(b) for b in micro_batches)
    for batch in micro_batches:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels = batch["labels"][:, 1:]
        mask = labels != -100
        logp = logits.log_softmax(-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        mean = -(logp * mask).sum() / mask.sum()  # a hand-written masked mean: 0/0 on an empty micro-batch
        (mean * mask.sum() / total).backward()


def test_check_accumulate_accepts_reference(capsys):
    assert tw.check_accumulate_token_weighted(_reference)
    assert "✅" in capsys.readouterr().out


def test_check_accumulate_rejects_stub():
    def stub(model, micro_batches):
        raise NotImplementedError

    result = tw.check_accumulate_token_weighted(stub)
    assert not result and "not implemented" in result.message


def test_check_accumulate_names_the_per_micro_batch_mean():
    result = tw.check_accumulate_token_weighted(_per_micro_batch_mean)
    assert not result and "per-micro-batch mean ÷ K" in result.message


def test_check_accumulate_names_the_empty_micro_batch_nan():
    result = tw.check_accumulate_token_weighted(_hand_mean_rescaled)
    assert not result and "0/0" in result.message


def test_check_accumulate_names_a_missing_backward():
    result = tw.check_accumulate_token_weighted(lambda model, micro_batches: None)
    assert not result and ".backward()" in result.message


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
