"""The maintainers' tooling, apart from the learner package ``course_utils``.

Run from the repository root (``python -m tools.NAME``); the Makefile names each command. Nothing
here is installed with the course, and no notebook imports it.

- ``notebook_runner``     the one way a notebook is run: in a kernel (nbclient) or under nbval
- ``build_course_model``  rebuild the shipped course models (``make model``)
- ``make_exercises``      generate ``notebooks/`` from ``solutions/`` (``make exercises``)
- ``run_solutions``       re-execute solutions in place, the run-time table (``make timings``)
- ``robustness``          the robustness matrix (``make robustness``)
- ``claims``              the myth-vs-measurement table (``make claims``)
- ``lesson_report``       per-lesson pass/fail under another stack (``make test-latest``, ``gpu_check.sh``)
- ``watch_overhead``      SFTWatch's cost per training step, with and without it (a benchmark)
- ``install_torch``, ``fast_install``  ``make install``'s steps (scripts: they run before the course is
  installed, so they import nothing from it)
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: solutions/, notebooks/, tests/
