"""The held-out split: documents the portal keeps apart from a run's uploaded text files, so that
its checkpoints are evaluated on text no agent trained on (runs/evaluation/). Agents are sent
the rest of each file (the join answer's data files); the held-out documents stay in
``Run.heldout_file``, which no URL serves."""

from __future__ import annotations

from dataclasses import dataclass

# A file without blank lines is one document to the agents; its lines are held out in blocks of
# about a document's length (runs/setup/corpus.py writes 3 to 8 sentences per document).
LINES_PER_BLOCK = 8
# Held out from one file at most: a small file still leaves most of itself to train on.
MAX_SHARE = 4


@dataclass(frozen=True)
class HeldOutSplit:
    training_text: str
    documents: list[str]  # each one held-out document, its lines joined by "\n"


def _units(text: str) -> tuple[list[list[str]], str]:
    """The file's documents (blank-line separated), or blocks of its lines when it has no blank
    line; and the separator that joins them back as the agents would read them."""
    documents: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            documents[-1].append(line)
        elif documents[-1]:
            documents.append([])
    documents = [document for document in documents if document]
    if len(documents) > 1:
        return documents, "\n\n"
    lines = documents[0] if documents else []
    return [lines[start:start + LINES_PER_BLOCK] for start in range(0, len(lines), LINES_PER_BLOCK)], "\n"


def heldout_split(text: str, *, wanted: int) -> HeldOutSplit:
    """Take up to ``wanted`` documents out of ``text``, spread evenly over it (a file sorted by
    topic or date gives a held-out set like the whole), and at most a quarter of them."""
    units, separator = _units(text)
    count = min(max(wanted, 0), len(units) // MAX_SHARE)
    if count == 0:
        return HeldOutSplit(training_text=text, documents=[])
    step = len(units) / count
    picked = {int(index * step + step / 2) for index in range(count)}
    training = separator.join("\n".join(unit) for index, unit in enumerate(units) if index not in picked)
    return HeldOutSplit(training_text=training + "\n",
                        documents=["\n".join(units[index]) for index in sorted(picked)])


def heldout_documents_read(text: str) -> list[str]:
    """The documents of a run's held-out file (blank-line separated, as :func:`heldout_join` writes)."""
    return [document for document in text.split("\n\n") if document.strip()]


def heldout_join(documents: list[str]) -> str:
    return "".join(f"{document}\n\n" for document in documents)
