"""Reference answers of the exercises, one module per lesson (``lesson00.py`` … ``lesson08.py``).

The checkers import them lazily to compute expected outputs; no lesson notebook imports them, so
the learner's copy never holds the answer (``tests/test_exercise_notebooks*.py`` run every exercise
notebook with its stubs and check that no callable reachable from the kernel's namespace passes a
checker). The capstone's fix is checked by properties (the doctor is its oracle); its reference
answer, ``lesson08.py``, is what the tests check the checker with.
Peeking here is allowed, of course — it is a course, not an exam — but it is a deliberate step.
"""
