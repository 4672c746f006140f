"""Writes for runs: creation, configuration, lifecycle, moderation and data."""

import itertools
import logging
from collections.abc import Iterator

from celery import shared_task
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext_lazy
from tokenizers import Tokenizer

from accounts.models import Notification, User
from accounts.notifications import notify_many
from peer_agent.protocol import MID_RUN_EDITABLE, RunConfig, changed_fields
from portal.logs import log_context
from runs.access.authority import authority_generate
from runs.models import CreditRollup, DataFile, Run, RunBan, RunEvent, RunMembership, TrainingSession
from runs.setup import tokenization
from runs.setup.heldout import heldout_join, heldout_split

logger = logging.getLogger(__name__)


class RunError(Exception):
    """A run action that is not allowed; the message is meant for the person who tried it."""


# A refused transition in the reader's words: "a finished run cannot resume".
STATUS_WORDS = {
    Run.Status.DRAFT: pgettext_lazy("a … run", "draft"), Run.Status.ACTIVE: pgettext_lazy("a … run", "active"),
    Run.Status.PAUSED: pgettext_lazy("a … run", "paused"), Run.Status.FINISHED: pgettext_lazy("a … run", "finished"),
}
ACTION_WORDS = {
    "activate": pgettext_lazy("a run cannot …", "activate"), "pause": pgettext_lazy("a run cannot …", "pause"),
    "resume": pgettext_lazy("a run cannot …", "resume"), "finish": pgettext_lazy("a run cannot …", "finish"),
    "restart": pgettext_lazy("a run cannot …", "restart"),
}
# action: (allowed from, to, event kind)
TRANSITIONS = {
    "activate": ({Run.Status.DRAFT}, Run.Status.ACTIVE, RunEvent.Kind.ACTIVATED),
    "pause": ({Run.Status.ACTIVE}, Run.Status.PAUSED, RunEvent.Kind.PAUSED),
    "resume": ({Run.Status.PAUSED}, Run.Status.ACTIVE, RunEvent.Kind.RESUMED),
    "finish": ({Run.Status.ACTIVE, Run.Status.PAUSED}, Run.Status.FINISHED, RunEvent.Kind.FINISHED),
    # Training goes on from the run's newest checkpoint, with its optimizer state and epoch: agents start from
    # it when no peer online has a newer state (peer_agent/training.py, Trainer._checkpoint_resume).
    "restart": ({Run.Status.FINISHED}, Run.Status.ACTIVE, RunEvent.Kind.RESTARTED),
}


def run_event_record(*, run: Run, actor: User | None, kind: str, detail: str = "") -> RunEvent:
    return RunEvent.objects.create(run=run, actor=actor, kind=kind, detail=detail[:500])


@transaction.atomic
def run_create(*, organizer: User, name: str, slug: str, description: str, visibility: str, config: RunConfig,
               audience: str = Run.Audience.EVERYONE, heldout_size: int = 200, validation_split: str = "validation",
               card: dict | None = None) -> Run:
    """A draft run; ``card`` holds its model-card metadata and probe cadence (license, languages, probe_every)."""
    public_key, encrypted_private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
    run = Run.objects.create(
        name=name,
        slug=slug,
        description=description,
        visibility=visibility,
        audience=audience,
        config=config.model_dump(mode="json"),
        heldout_size=heldout_size,
        validation_split=validation_split,
        authority_public_key=public_key,
        authority_private_key=encrypted_private_key,
        **(card or {}),
    )
    run.organizers.add(organizer)
    run_event_record(run=run, actor=organizer, kind=RunEvent.Kind.CREATED)
    _sources_check_start(run=run)
    return run


@transaction.atomic
def run_update(*, run: Run, actor: User, name: str, description: str, visibility: str, config: RunConfig,
               audience: str | None = None, heldout_size: int | None = None, validation_split: str | None = None,
               card: dict | None = None) -> set[str]:
    """Save an edit and return the config fields it changed; only mid-run-safe ones once started.
    The held-out settings are locked too: evaluations compare only on one held-out set. ``card``: the
    model-card metadata and probe cadence, editable any time."""
    changed = changed_fields(run.configuration, config)
    heldout = {"heldout_size": heldout_size or run.heldout_size, "validation_split": validation_split or run.validation_split}
    changed |= {name for name, value in heldout.items() if value != getattr(run, name)}
    if run.status != Run.Status.DRAFT and changed - MID_RUN_EDITABLE:
        locked = ", ".join(sorted(changed - MID_RUN_EDITABLE))
        raise RunError(_("these settings cannot change once the run has started: %(locked)s") % {"locked": locked})
    run.name, run.description, run.visibility = name, description, visibility
    run.audience = audience or run.audience
    run.config = config.model_dump(mode="json")
    run.heldout_size, run.validation_split = heldout["heldout_size"], heldout["validation_split"]
    for field, value in (card or {}).items():
        setattr(run, field, value)
    run.save(update_fields=["name", "description", "visibility", "audience", "config", *heldout, *(card or {})])
    if changed:
        run_event_record(run=run, actor=actor, kind=RunEvent.Kind.CONFIG_CHANGED, detail=", ".join(sorted(changed)))
    if changed & _SOURCES_FIELDS or run.sources_check != Run.SourcesCheck.PASSED:
        _sources_check_start(run=run)
    return changed


# What the check of the hub sources reads: a change to any of them checks them again.
_SOURCES_FIELDS = {"data.source", "data.hub", "data.heldout", "validation_split"}


def _sources_check_start(*, run: Run) -> None:
    """Queue the check of the run's hub sources (they are read in the worker, which may reach the Hub)."""
    if run.configuration.data.source != "hub":
        Run.objects.filter(pk=run.pk).update(sources_check=Run.SourcesCheck.UNCHECKED, sources_error="")
        return
    Run.objects.filter(pk=run.pk).update(sources_check=Run.SourcesCheck.CHECKING, sources_error="")
    run.sources_check, run.sources_error = Run.SourcesCheck.CHECKING, ""
    transaction.on_commit(lambda: sources_check_task.delay(run.pk))


def sources_check(*, run_id: int) -> None:
    """Resolve the run's hub sources as agents will (runs in the Celery worker) and record whether
    they load, or the sentences that say why not, for the run's page and settings form."""
    from peer_agent.sources import hub_sources_problems  # imports datasets: only the worker pays for it

    run = Run.objects.get(pk=run_id)
    config = run.configuration
    if config.data.source != "hub":
        return
    validation_split = run.validation_split if config.data.heldout == "validation_split" else None
    try:
        problems = hub_sources_problems(config.data, validation_split=validation_split)
    except Exception as exc:  # the organizer sees what went wrong; the log keeps the trace
        logger.exception("checking the hub sources of run %s failed", run.slug)
        problems = [_("The hub sources could not be checked (%(error)s); save the settings again to retry.")
                    % {"error": str(exc)[:500]}]
    with transaction.atomic():
        current = Run.objects.select_for_update().get(pk=run.pk)
        if current.config != run.config or current.validation_split != run.validation_split:
            return  # edited meanwhile: the check of the new settings will report
        current.sources_check = Run.SourcesCheck.FAILED if problems else Run.SourcesCheck.PASSED
        current.sources_error = " ".join(problems)[:4000]
        current.save(update_fields=["sources_check", "sources_error"])


def _sources_ready(run: Run) -> None:
    """Refuse to start work on hub sources that were not found to load."""
    if run.configuration.data.source != "hub" or run.sources_check == Run.SourcesCheck.PASSED:
        return
    if run.sources_check == Run.SourcesCheck.FAILED:
        raise RunError(_("the run's hub sources do not load: %(problems)s Fix them in the run's settings.")
                       % {"problems": run.sources_error})
    if run.sources_check == Run.SourcesCheck.CHECKING:
        raise RunError(_("the run's hub sources are still being checked; try again in a minute"))
    raise RunError(_("the run's hub sources have not been checked: save the run's settings to check them"))


@transaction.atomic
def run_transition(*, run: Run, actor: User, action: str) -> None:
    allowed_from, target, kind = TRANSITIONS[action]
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status not in allowed_from:
        raise RunError(_("a %(status)s run cannot %(action)s")
                       % {"status": STATUS_WORDS[run.status], "action": ACTION_WORDS[action]})
    if action == "activate" and run.tokenizer_status != Run.TokenizerStatus.READY:
        raise RunError(_("the run needs a tokenizer before it starts: train one or upload tokenizer.json"))
    if action == "activate" and run.configuration.data.source == "files" and not run.data_files.exists():
        raise RunError(_("the run reads uploaded files: upload at least one text file before it starts"))
    if action == "activate":
        _sources_ready(run)
    if action == "restart" and not run.checkpoints.exists():
        raise RunError(_("the run saved no checkpoint to restart from; create a new run to train again from random weights"))
    run.status = target
    run.save(update_fields=["status"])
    event = run_event_record(run=run, actor=actor, kind=kind)
    if kind in RUN_EVENT_NOTICES:
        transaction.on_commit(lambda: run_event_notify_task.delay(event.pk))


# The run's lifecycle events its volunteers are told about, and as what.
RUN_EVENT_NOTICES = {RunEvent.Kind.PAUSED: Notification.Kind.RUN_PAUSED, RunEvent.Kind.RESUMED: Notification.Kind.RUN_RESUMED,
                     RunEvent.Kind.FINISHED: Notification.Kind.RUN_FINISHED,
                     RunEvent.Kind.RESTARTED: Notification.Kind.RUN_RESUMED}


def run_event_notify(*, event_id: int) -> int:
    """Notify everyone who trained for the event's run (runs in the Celery worker). The event's id is
    the idempotency key: a retried task notifies nobody twice. Returns the notifications made."""
    event = RunEvent.objects.select_related("run").get(pk=event_id)
    run = event.run
    volunteers = User.objects.filter(pk__in=TrainingSession.objects.filter(run=run).values("user_id"), is_active=True)
    user_ids, made = list(volunteers.order_by("pk").values_list("pk", flat=True)), 0
    # One insert per thousand volunteers (a row and a commit per volunteer took 10–17 ms each,
    # docs/benchmarks.md), and no transaction that holds a large run's volunteers at once.
    for start in range(0, len(user_ids), 1000):
        with transaction.atomic():
            made += notify_many(user_ids=user_ids[start:start + 1000], kind=RUN_EVENT_NOTICES[event.kind],
                                key=f"run-event:{event.pk}", context={"run": run.name, "url": run.get_absolute_url()})
    return made


@transaction.atomic
def run_ban(*, run: Run, actor: User, user: User, reason: str = "") -> None:
    if run.organizers.filter(pk=user.pk).exists():
        raise RunError(_("an organizer of the run cannot be banned from it"))
    created = RunBan.objects.get_or_create(run=run, user=user, defaults={"banned_by": actor, "reason": reason})[1]
    if created:
        # Open sessions end now; their access tokens expire within minutes and are not refreshed.
        run.sessions.filter(user=user, ended_at=None).update(ended_at=timezone.now())
        run_event_record(run=run, actor=actor, kind=RunEvent.Kind.BANNED, detail=f"{user.username}: {reason}")


@transaction.atomic
def run_unban(*, run: Run, actor: User, user: User) -> None:
    deleted, _ = RunBan.objects.filter(run=run, user=user).delete()
    if deleted:
        run_event_record(run=run, actor=actor, kind=RunEvent.Kind.UNBANNED, detail=user.username)


def run_membership_redeem(*, run: Run, user: User, code: str) -> None:
    if run.visibility != Run.Visibility.INVITE:
        return
    if code.strip() != run.join_code:
        raise RunError(_("that join code is not right; ask the run's organizers for it"))
    RunMembership.objects.get_or_create(run=run, user=user)


def run_allowlist_set(*, run: Run, actor: User, usernames: list[str]) -> None:
    users = list(User.objects.filter(username__in=usernames))
    missing = sorted(set(usernames) - {user.username for user in users})
    if missing:
        raise RunError(_("no volunteer is called %(names)s") % {"names": ", ".join(missing)})
    run.allowlist.set(users)


def _utf8_lines(content: bytes) -> int:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunError(_("the file is not UTF-8 text (byte %(byte)d cannot be decoded)") % {"byte": exc.start}) from None
    if "\x00" in text:
        raise RunError(_("the file contains NUL bytes; upload plain text, one sentence per line"))
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


@transaction.atomic
def data_file_add(*, run: Run, actor: User, name: str, content: bytes) -> DataFile:
    """Store an uploaded text file; documents it gives to the run's held-out split (up to the run's
    held-out size) are kept apart, and the agents are served the rest."""
    if len(content) > settings.DATA_FILE_MAX_BYTES:
        raise RunError(_("the file is %(size)d MiB; the limit is %(limit)d MiB per file")
                       % {"size": len(content) // 2**20, "limit": settings.DATA_FILE_MAX_BYTES // 2**20})
    if not content.strip():
        raise RunError(_("the file is empty"))
    _utf8_lines(content)
    run = Run.objects.select_for_update().get(pk=run.pk)  # two uploads at once must not both fill the split
    split = heldout_split(content.decode("utf-8"), wanted=run.heldout_size - run.heldout_documents)
    if split.documents:
        _heldout_extend(run=run, documents=split.documents)
        content = split.training_text.encode("utf-8")
    data_file = DataFile(run=run, name=name[:200], size=len(content), lines=_utf8_lines(content), uploaded_by=actor)
    data_file.file.save(f"run-{run.pk}.txt", ContentFile(content), save=False)
    data_file.save()
    held = f" ({len(split.documents)} documents held out for evaluation)" if split.documents else ""
    run_event_record(run=run, actor=actor, kind=RunEvent.Kind.DATA, detail=f"uploaded {data_file.name}{held}")
    return data_file


def _heldout_extend(*, run: Run, documents: list[str]) -> None:
    earlier = ""
    if run.heldout_file:
        with run.heldout_file.open("rb") as handle:
            earlier = handle.read().decode("utf-8")
        run.heldout_file.delete(save=False)
    run.heldout_file.save(f"run-{run.pk}-heldout.txt", ContentFile((earlier + heldout_join(documents)).encode()), save=False)
    run.heldout_documents += len(documents)
    run.save(update_fields=["heldout_file", "heldout_documents"])


@transaction.atomic
def data_file_remove(*, data_file: DataFile, actor: User) -> None:
    run = data_file.run
    if run.status != Run.Status.DRAFT:
        raise RunError(_("data files cannot be removed once the run has started"))
    data_file.file.delete(save=False)
    data_file.delete()
    run_event_record(run=run, actor=actor, kind=RunEvent.Kind.DATA, detail=f"removed {data_file.name}")


def data_sample(*, run: Run, limit: int) -> Iterator[str]:
    """Up to `limit` lines of the run's data, from its uploaded files or streamed from the hub.

    The database is read here, not in the generator: the tokenizers library may consume the
    lines on another thread, which must not touch the ORM.
    """
    config = run.configuration
    if config.data.source == "files":
        paths = [data_file.file.path for data_file in run.data_files.all()]
        return itertools.islice(_file_lines(paths), limit)
    from peer_agent.sources import hub_documents  # imports datasets: only the worker pays for it

    data = config.data
    # The held-out documents stay out of the vocabulary's sample too: the evaluation reads them as unseen text.
    stream = hub_documents(data, seed=0).filter(lambda row: not data.holds_out(row["text"] or ""))
    return (example["text"] for example in stream.take(limit))


def _file_lines(paths: list[str]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            yield from (line.strip() for line in handle if line.strip())


def tokenizer_store(*, run: Run, json_text: str) -> None:
    run.tokenizer_file.save(f"run-{run.pk}-tokenizer.json", ContentFile(json_text.encode()), save=False)
    run.tokenizer_status, run.tokenizer_error = Run.TokenizerStatus.READY, ""
    run.save(update_fields=["tokenizer_file", "tokenizer_status", "tokenizer_error"])


def _tokenizer_changeable(run: Run) -> None:
    if run.status != Run.Status.DRAFT:
        raise RunError(_("the tokenizer cannot change once the run has started: peers' vocabularies must agree"))
    if run.started_from:
        raise RunError(_("the run starts from %(source)s and carries its tokenizer, which its weights were trained "
                         "with; empty “Initial weights” in the run's settings to choose another") % {"source": run.started_from})


@transaction.atomic
def tokenizer_upload(*, run: Run, actor: User, json_text: str) -> None:
    _tokenizer_changeable(run)
    try:
        tokenization.tokenizer_validate(json_text)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    tokenizer_store(run=run, json_text=json_text)
    run_event_record(run=run, actor=actor, kind=RunEvent.Kind.TOKENIZER, detail="uploaded tokenizer.json")


def tokenizer_train_start(*, run: Run, actor: User) -> None:
    """Queue the tokenizer training; the run page shows its progress."""
    _tokenizer_changeable(run)
    if run.configuration.data.source == "files" and not run.data_files.exists():
        raise RunError(_("upload the run's text files first: the tokenizer learns its vocabulary from them"))
    _sources_ready(run)
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(tokenizer_status=Run.TokenizerStatus.TRAINING, tokenizer_error="")
        CreditRollup.boards_changed()  # the run list shows the tokenizer's status; update() sends no signal
        run_event_record(run=run, actor=actor, kind=RunEvent.Kind.TOKENIZER, detail="training started")
        transaction.on_commit(lambda: tokenizer_train_task.delay(run.pk))


def tokenizer_train(*, run_id: int) -> None:
    """Train the run's Unigram tokenizer on a sample of its data (runs in the Celery worker)."""
    run = Run.objects.get(pk=run_id)
    config = run.configuration.tokenizer
    try:
        tokenizer = tokenization.tokenizer_train(
            lines=data_sample(run=run, limit=config.sample_size),
            vocab_size=config.vocab_size,
            lowercase=config.lowercase,
            strip_accents=config.strip_accents,
        )
    except Exception as exc:  # a failed training is shown to the organizer, never lost in a log
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(tokenizer_status=Run.TokenizerStatus.FAILED, tokenizer_error=str(exc)[:2000])
            CreditRollup.boards_changed()  # as in tokenizer_train_start
        raise
    tokenizer_store(run=run, json_text=tokenizer.to_str())
    logger.info("trained the run's tokenizer: %d tokens", tokenizer.get_vocab_size())


def run_tokenizer_try(*, run: Run, text: str) -> list[str]:
    """How the run's stored tokenizer splits ``text`` (the "try it" box of the run page)."""
    with run.tokenizer_file.open("rb") as handle:
        tokenizer = Tokenizer.from_str(handle.read().decode())
    return tokenization.tokenizer_try(tokenizer, text)


# --- the tasks this module queues: the Celery worker runs them (CELERY_IMPORTS in portal/settings.py) ---

def _run_slug(run_id: int) -> str | None:
    return Run.objects.filter(pk=run_id).values_list("slug", flat=True).first()


@shared_task(acks_late=True)
def tokenizer_train_task(run_id: int) -> None:
    with log_context(run=_run_slug(run_id)):
        tokenizer_train(run_id=run_id)


@shared_task(acks_late=True, ignore_result=True)
def sources_check_task(run_id: int) -> None:
    """The organizer saved hub sources: check that they load, for the run's page and settings form."""
    with log_context(run=_run_slug(run_id)):
        sources_check(run_id=run_id)


@shared_task(acks_late=True, ignore_result=True)
def run_event_notify_task(event_id: int) -> int:
    """A run was paused, resumed or finished: notify the volunteers who trained for it."""
    return run_event_notify(event_id=event_id)
