"""Reference answers of the exercises, one module per lesson (``lesson00.py`` … ``lesson07.py``).

The checkers import them lazily to compute expected outputs; no lesson notebook imports them, so
the learner's copy never holds the answer (``tests/test_exercise_notebooks*.py`` run every exercise
notebook with its stubs and check that no callable reachable from the kernel's namespace passes a
checker). The capstone's fix is checked by properties; a reference fix for its tests sits in
``tests/test_checkers.py``.
Peeking here is allowed, of course — it is a course, not an exam — but it is a deliberate step.
"""
