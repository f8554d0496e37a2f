"""The course's progress bars close as finished when a run meets its criterion early (issue 43's browser pass:
lesson 10's bar ended red at "30 % 90/300" because tqdm paints a bar closed before its total as failed)."""

from course_utils import load_course_model, make_batches, make_messages
from course_utils.training import _close_bar, train


def test_a_bar_closed_early_is_closed_full():
    from tqdm import tqdm

    bar = tqdm(total=300, disable=False, leave=False)
    bar.update(90)
    _close_bar(bar)
    assert bar.n == bar.total == 90, "the notebook bar is painted red only when n < total at close"


def test_train_stopping_on_its_criterion_closes_its_bar_full(monkeypatch):
    import course_utils.training as training

    closed = []
    monkeypatch.setattr(training, "_close_bar", lambda bar: closed.append((bar.n, bar.total)))
    model, tok = load_course_model()
    batches = make_batches(tok, make_messages("add", 4, seed=0), 4)
    records = train(model, batches, steps=10, on_step=lambda step, m: step == 3, progress=True)
    assert len(records) == 3 and closed == [(3, 10)], "train() hands the early-stopped bar to _close_bar"
