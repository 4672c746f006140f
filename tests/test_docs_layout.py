"""docs/benchmarks.md is a reference, not a lab notebook (issue 34).

Each numbered section opens with what a reader comes for: its current figures and the command that
produced them. Superseded runs and how a figure was reached live in docs/benchmarks-history.md, under
the same section numbers and titles, since code and docs cite "docs/benchmarks.md, section N".
"""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
OPENING_LINES = 15
COMMAND = re.compile(r"python -m bench\.|bash \.ci/run|make |peer-agent")
SECTION = re.compile(r"^## (\d+)\. .*$", re.M)


def numbered_sections(text: str) -> dict[str, list[str]]:
    """Each ``## N. Title`` heading and the lines of its section after the heading."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if SECTION.fullmatch(line)]
    return {lines[h]: lines[h + 1:end] for h, end in zip(heads, [*heads[1:], len(lines)])}


def opening_gaps(body: list[str]) -> list[str]:
    """What the first lines of a section lack: a command and a figure."""
    opening = body[:OPENING_LINES]
    gaps = []
    if not any(COMMAND.search(line) for line in opening):
        gaps.append("a command (python -m bench., bash .ci/run, make or peer-agent)")
    if not any(re.search(r"\d", line) for line in opening):
        gaps.append("a figure")
    return gaps


BENCHMARKS = numbered_sections((DOCS / "benchmarks.md").read_text())


def test_the_sections_are_numbered_one_to_n():
    numbers = [int(SECTION.match(heading).group(1)) for heading in BENCHMARKS]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 24


@pytest.mark.parametrize("heading", list(BENCHMARKS), ids=[f"section-{SECTION.match(h).group(1)}" for h in BENCHMARKS])
def test_every_section_opens_with_its_figures_and_the_command_that_produced_them(heading):
    gaps = opening_gaps(BENCHMARKS[heading])
    assert not gaps, f"docs/benchmarks.md `{heading}`: its first {OPENING_LINES} lines lack {' and '.join(gaps)}"


def test_the_history_keeps_the_same_section_numbers_and_titles():
    history = numbered_sections((DOCS / "benchmarks-history.md").read_text())
    assert list(history) == list(BENCHMARKS)


def test_a_section_that_opens_with_history_is_told_apart():
    """The check fails on a section that opens with its method and keeps the command further down."""
    story = ["", *[f"How the bench came about, part {i}." for i in range(OPENING_LINES)],
             "$ .venv/bin/python -m bench.soak --minutes 30"]
    assert opening_gaps(story) == ["a command (python -m bench., bash .ci/run, make or peer-agent)"]
    assert opening_gaps(["- **Now:** 761 reports.", "- **Command:** `.venv/bin/python -m bench.soak`"]) == []
