"""Reference answers of the exercises, one module per lesson (``lesson00.py`` … ``lesson08.py``).

The checkers import them lazily to compute expected outputs; no lesson notebook imports them, so
the learner's copy never holds the answer (``tests/test_giveaway.py`` runs every exercise notebook
with its stubs and checks that no callable reachable from the kernel's namespace passes a checker).
Peeking here is allowed, of course — it is a course, not an exam — but it is a deliberate step.
"""
