"""The exercises: lesson NN's checkers in ``lessonNN.py``, its reference answers in ``answers/``.

A checker (``check_*``) runs the learner's function on cases the notebook never shows and explains
what is wrong (``course_utils.checks``). The generators of those cases — the broken runs, incidents
and set-ups that know their cause — are private to the checker's module; what a notebook may show
is an artefact without its cause. Graders import the core, their lesson's module and their answers;
no lesson module imports this package.
"""
