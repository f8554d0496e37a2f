"""quiet.brief: a library's message as a lesson prints it."""

import pytest

from course_utils.quiet import brief


def test_brief_cuts_a_library_message_where_a_reader_expects_it():
    trl = ("[RANK 0] The chat template does not include the end-of-turn token in the loss mask; the model "
           "may not learn to stop. The training loss still looks healthy, so it surfaces at inference.")
    first = "The chat template does not include the end-of-turn token in the loss mask; the model may not"
    assert brief(trl, 120) == first + " learn to stop."
    assert brief(trl, 400) == trl.removeprefix("[RANK 0] ")  # short enough: whole, prefix gone
    span = "not training-compatible (missing `{% generation %}` markers) and more words to cut " * 3
    cut = brief(span, 40)
    assert cut.endswith(" …") and cut.count("`") % 2 == 0 and len(cut) <= 42, cut
    words = span.split()
    assert all(brief(span, n)[:-2].split()[-1] in words for n in range(20, 120, 7)), "no word cut in two"
    assert brief("first line\nsecond line") == "first line"
    for empty in (None, "", "   ", "[RANK 0] "):
        with pytest.raises(ValueError, match="no text"):
            brief(empty)
    with pytest.raises(TypeError, match="one message"):
        brief(["a", "b"])
    with pytest.raises(ValueError, match="limit"):
        brief("x", limit=0)


def test_no_progress_bars_switches_each_library_and_restores_it():
    import datasets
    from transformers.utils import logging as hf_logging

    from course_utils.quiet import no_progress_bars

    before = hf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    datasets.enable_progress_bars()
    try:
        with no_progress_bars():
            assert not hf_logging.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
        with no_progress_bars(datasets=False):  # a block that maps no dataset: datasets is left alone
            assert not hf_logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled()
        assert hf_logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled()
    finally:
        if not before[0]:
            hf_logging.disable_progress_bar()
        if not before[1]:
            datasets.disable_progress_bars()
    with pytest.raises(TypeError, match="datasets='no' must be True or False"):
        with no_progress_bars(datasets="no"):
            pass
