"""Downstream probes' labelled sets: reading the formats organizers already have, checking them, and
storing a probe. The fine-tune that scores checkpoints on them is runs/swarm/probing.py.

Token classification is CoNLL/WikiANN: one ``token label`` line per token (further columns between
them are ignored, as CoNLL-2003's are), a blank line between sentences, ``-DOCSTART-`` lines skipped,
and WikiANN's ``xx:`` language prefix taken off the token. Labels are IOB2 (``O``, ``B-X``, ``I-X``),
what seqeval's entity-level F1 reads. Text classification is CSV ``text,label``, with or without
that header row.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction

from accounts.models import User
from runs.models import Probe, Run, RunEvent

_WIKIANN_PREFIX = re.compile(r"^[a-z]{2,3}:(?=.)")
_IOB = re.compile(r"^(O|[BI]-\S+)$")


class ProbeFormatError(ValueError):
    """A labelled set that cannot be used; the message says where and what to fix."""


@dataclass(frozen=True)
class LabelledSet:
    """One part (train or test) of a probe: sentences of (tokens, tags), or (text, label) rows."""

    task: str
    examples: list  # list[tuple[list[str], list[str]]] for tokens, list[tuple[str, str]] for text

    @property
    def labels(self) -> set[str]:
        if self.task == Probe.Task.TOKENS:
            return {tag for _, tags in self.examples for tag in tags}
        return {label for _, label in self.examples}


def tokens_parse(text: str) -> list[tuple[list[str], list[str]]]:
    """CoNLL/WikiANN lines into sentences of (tokens, IOB2 tags)."""
    sentences, tokens, tags = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if tokens:
                sentences.append((tokens, tags))
                tokens, tags = [], []
            continue
        if len(fields) < 2:
            raise ProbeFormatError(f"line {number}: expected “token label”, found one column ({line.strip()[:40]!r})")
        tag = fields[-1]
        if not _IOB.match(tag):
            raise ProbeFormatError(f"line {number}: label {tag[:40]!r} is not IOB2 (O, B-TYPE or I-TYPE)")
        tokens.append(_WIKIANN_PREFIX.sub("", fields[0]))
        tags.append(tag)
    if tokens:
        sentences.append((tokens, tags))
    return sentences


def text_parse(text: str) -> list[tuple[str, str]]:
    """CSV ``text,label`` rows (a first row ``text,label`` is a header)."""
    # newline="": the reader itself ends rows at \n, \r\n or \r, and keeps line breaks inside quotes.
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        table = list(reader)
    except csv.Error as exc:  # a cell past the csv module's field size limit, mostly an unclosed quote
        raise ProbeFormatError(f"line {reader.line_num} cannot be read as CSV ({exc}); a text may have at most "
                               f"{csv.field_size_limit():,} characters, and a quote must be closed") from None
    rows = []
    for number, row in enumerate(table, start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2:
            raise ProbeFormatError(f"row {number}: expected two columns, text and label; found {len(row)}")
        if number == 1 and [cell.strip().lower() for cell in row] == ["text", "label"]:
            continue
        content, label = row[0].strip(), row[1].strip()
        if not content or not label:
            raise ProbeFormatError(f"row {number}: the text and the label must both be filled in")
        rows.append((content, label))
    return rows


def labelled_set_read(*, task: str, content: bytes, part: str) -> LabelledSet:
    """Decode and parse one uploaded part; every problem is a ProbeFormatError naming the part."""
    if len(content) > settings.PROBE_MAX_FILE_BYTES:
        raise ProbeFormatError(f"the {part} part is larger than {settings.PROBE_MAX_FILE_BYTES // 1024} KiB")
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProbeFormatError(f"the {part} part is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    parse = tokens_parse if task == Probe.Task.TOKENS else text_parse
    try:
        examples = parse(text)
    except ProbeFormatError as exc:
        raise ProbeFormatError(f"the {part} part, {exc}") from None
    if not examples:
        raise ProbeFormatError(f"the {part} part has no examples")
    return LabelledSet(task=task, examples=examples)


def labelled_sets_check(train: LabelledSet, test: LabelledSet) -> None:
    """The test part may use only labels the fine-tune learns from the train part."""
    unseen = sorted(test.labels - train.labels)
    if unseen:
        raise ProbeFormatError(f"the test part uses labels the train part never has: {', '.join(unseen[:10])}")
    if len(train.labels) < 2:
        raise ProbeFormatError("the train part needs at least two different labels")


def probe_read(probe: Probe) -> tuple[LabelledSet, LabelledSet]:
    """A stored probe's train and test parts (checked when uploaded)."""
    parts = []
    for part, field in (("train", probe.train_file), ("test", probe.test_file)):
        with field.open("rb") as handle:
            parts.append(labelled_set_read(task=probe.task, content=handle.read(), part=part))
    return parts[0], parts[1]


@transaction.atomic
def probe_add(*, run: Run, actor: User | None, name: str, task: str, train: bytes, test: bytes) -> Probe:
    """Check both parts and store the probe; nothing is stored when either part is refused."""
    if task not in Probe.Task.values:
        raise ProbeFormatError(f"unknown task {task[:20]!r}; choose {' or '.join(Probe.Task.values)}")
    if run.probes.filter(name=name).exists():
        raise ProbeFormatError(f"the run already has a probe named {name!r}")
    train_set = labelled_set_read(task=task, content=train, part="train")
    test_set = labelled_set_read(task=task, content=test, part="test")
    labelled_sets_check(train_set, test_set)
    probe = Probe(run=run, name=name, task=task, labels=sorted(train_set.labels), uploaded_by=actor,
                  train_examples=len(train_set.examples), test_examples=len(test_set.examples))
    extension = "conll" if task == Probe.Task.TOKENS else "csv"
    probe.train_file.save(f"{run.hivemind_run_id}/{name}-train.{extension}", ContentFile(train), save=False)
    probe.test_file.save(f"{run.hivemind_run_id}/{name}-test.{extension}", ContentFile(test), save=False)
    probe.save()
    RunEvent.objects.create(run=run, actor=actor, kind=RunEvent.Kind.DATA, detail=f"probe {name} added")
    return probe


def probe_remove(*, probe: Probe, actor: User | None) -> None:
    probe.train_file.delete(save=False)
    probe.test_file.delete(save=False)
    probe.delete()
    RunEvent.objects.create(run=probe.run, actor=actor, kind=RunEvent.Kind.DATA, detail=f"probe {probe.name} removed")
