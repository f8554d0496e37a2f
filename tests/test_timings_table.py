"""INSTRUCTORS.md's run-time table is written by run_solutions, between its markers (never typed)."""

from pathlib import Path

import pytest

from tools.run_solutions import TABLE_BEGIN, TABLE_END, timings_table, write_table

ROOT = Path(__file__).resolve().parent.parent


def test_table_lists_each_notebook_the_total_and_where():
    table = timings_table({"solutions/00_tour.ipynb": (11.24, ""), "notebooks/00_tour.ipynb": (9.0, "x")},
                          "a 2-core CPU")
    assert table.startswith("Measured on: a 2-core CPU.")
    assert "| `solutions/00_tour.ipynb` | 11.2 |  |" in table and "| **total** | **20** | |" in table


def test_write_table_replaces_only_between_the_markers():
    text = f"intro\n{TABLE_BEGIN}\nold\n{TABLE_END}\noutro"
    assert write_table(text, "new") == f"intro\n{TABLE_BEGIN}\nnew\n{TABLE_END}\noutro"
    with pytest.raises(ValueError, match="timing markers"):
        write_table("no markers", "new")


def test_instructors_md_holds_a_generated_table():
    text = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
    between = text.split(TABLE_BEGIN)[1].split(TABLE_END)[0]
    assert "Measured on:" in between and "solutions/00_tour.ipynb" in between, "run: make instructors"


def test_readme_lesson_times_are_instructors_measured_ones():
    """README's run-time column is INSTRUCTORS.md's generated table, rounded: re-measured, not typed."""
    import re

    measured = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"\| `solutions/(\d\d)_\w+\.ipynb` \| ([\d.]+) \|", (ROOT / "INSTRUCTORS.md").read_text())}
    shown = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\| \[(\d\d) · .*\| (\d+) s \|$", (ROOT / "README.md").read_text(), flags=re.M)}
    assert shown and shown.keys() == measured.keys()
    for lesson, seconds in shown.items():
        assert abs(seconds - measured[lesson]) <= 1, (
            f"README says lesson {lesson} takes {seconds} s, INSTRUCTORS.md measured {measured[lesson]} s: "
            "copy the rounded value after `make instructors`")
