"""The take-home tools' docstring examples run as written (issue 31, item 7): a practitioner copies them
first. Each ``::`` block of Python in the module docstrings of the doctor and the watch, and in
``diagnose``'s, is executed in a fresh namespace; shell lines (``python -m ...``) are left to the CLI
tests."""

import textwrap

import pytest

from course_utils import doctor, watch


def python_examples(text: str) -> list[str]:
    """The indented blocks after a line ending in ``::`` whose first line is not a shell command."""
    blocks, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        block = []
        for following in lines[i + 1:]:
            if following.strip() and not following.startswith(" " * (len(line) - len(line.lstrip()) + 4)):
                break
            block.append(following)
        code = textwrap.dedent("\n".join(block)).strip()
        if code and not code.startswith("python -m"):
            blocks.append(code)
    return blocks


EXAMPLES = {f"{name} #{i}": code for name, text in (("doctor", doctor.__doc__), ("watch", watch.__doc__),
                                                   ("doctor.diagnose", doctor.diagnose.__doc__))
            for i, code in enumerate(python_examples(text))}


def test_the_tools_have_examples():
    assert any(k.startswith("watch") for k in EXAMPLES) and any(k.startswith("doctor.diagnose")
                                                                 for k in EXAMPLES), EXAMPLES


@pytest.mark.parametrize("label", sorted(EXAMPLES))
def test_each_docstring_example_runs(label, capsys):
    exec(compile(EXAMPLES[label], label, "exec"), {"__name__": "__example__"})  # noqa: S102
    assert capsys.readouterr().out.strip(), f"{label} printed nothing: an example shows its result"
