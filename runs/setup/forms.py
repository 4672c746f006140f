"""Run forms. The configuration fields are generated from `peer_agent.protocol.RunConfig`, which
also validates them: the browser form and the agent can never disagree on what a config is."""

import re
import types
import typing
from typing import Any, Literal

from django import forms
from django.conf import settings
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from accounts.models import User
from peer_agent.protocol import MID_RUN_EDITABLE, RunConfig, config_error_details, config_from_preset
from portal.formats import digits_localize
from runs.models import ModelLicense, Probe, Run
from runs.setup import probes, start
from runs.setup.config_labels import FIELDS
from runs.setup.start import StartSource

SECTIONS = {
    "model": _("Model"),
    "tokenizer": _("Tokenizer"),
    "data": _("Data"),
    "training": _("Training"),
    "averaging": _("Averaging and checkpoints"),
    "verification": _("Credit verification"),
}
PRESETS = {
    "tiny": _("tiny: a ~2M-parameter ALBERT that trains on laptop CPUs (demo)"),
    "base": _("base: ALBERT-base shape"),
    "large": _("large: sahajBERT, ALBERT-large with shared layers, ~18M parameters"),
    "xlarge": _("xlarge: ALBERT-xlarge shape"),
}
# The configuration's errors in the reader's words, by pydantic's error type (with its context); an
# error of another type keeps pydantic's English.
ERRORS = {
    "greater_than_equal": _("Must be at least %(ge)s."),
    "greater_than": _("Must be more than %(gt)s."),
    "less_than_equal": _("Must be at most %(le)s."),
    "less_than": _("Must be less than %(lt)s."),
    "string_too_short": _("Must have at least %(min_length)s characters."),
    "string_too_long": _("Must have at most %(max_length)s characters."),
    "finite_number": _("Must be a finite number."),
    "custom_preset_required": _("Required when the preset is “custom”."),
    "preset_fixed": _("Preset “%(preset)s” has %(name)s %(value)s; choose the preset “custom” to change it."),
    "heads_divide": _("Hidden size %(hidden)s is not divisible by the number of attention heads, %(heads)s."),
    "hub_sources_required": _("Required when the source is “hub”: name at least one dataset."),
    "probabilities_sum": _("The sources' probabilities add up to %(total)s; they must add up to 1."),
    "batch_below_peer": _("Must be at least one peer's batch (per device batch size × gradient accumulation steps "
                          "= %(peer_batch)s)."),
    "warmup_too_long": _("Must be less than the total steps (%(total)s)."),
    "timeout_too_short": _("Must exceed the matchmaking time (%(seconds)s s)."),
    "checkpoint_needed": _("Set this or the checkpoint every n epochs."),
    "sequence_too_long": _("Must not exceed the model's max position embeddings (%(positions)s)."),
}


def error_message(error: dict) -> str:
    """One configuration error (`config_error_details`) in the reader's language."""
    template = ERRORS.get(error["type"])
    if template is None:
        return error["msg"]
    shown = {key: f"{value:g}" if isinstance(value, float) else str(value) for key, value in error["ctx"].items()}
    return str(template) % {key: digits_localize(value) for key, value in shown.items()}
# A tiny run should show progress within minutes on CPUs, on text the organizer uploads.
_TINY_OVERRIDES = {
    "tokenizer": {"vocab_size": 4000, "sample_size": 20000},
    "data": {"source": "files", "hub": [], "max_seq_length": 128, "shuffle_buffer": 1000},
    "training": {"target_batch_size": 64, "per_device_batch_size": 8, "warmup_steps": 20, "total_steps": 5000},
    "averaging": {"matchmaking_time": 2.0, "averaging_timeout": 30.0, "checkpoint_every_epochs": 5,
                  "checkpoint_every_minutes": 10.0},
}

_HELDOUT_FIELDS = ("data__heldout", "data__heldout_share", "heldout_size", "validation_split")
_HELDOUT_SIZE = Run._meta.get_field("heldout_size").default
_VALIDATION_SPLIT = Run._meta.get_field("validation_split").default


def preset_config(preset: str) -> RunConfig:
    return config_from_preset(preset, **(_TINY_OVERRIDES if preset == "tiny" else {}))


def _form_field(annotation: Any, info) -> forms.Field:
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        optional, annotation = True, args[0]
    options = {"required": not optional}
    if typing.get_origin(annotation) is Literal:
        choices = [(value, value) for value in typing.get_args(annotation)]
        return forms.ChoiceField(choices=([("", "—")] if optional else []) + choices, **options)
    if annotation is bool:
        return forms.BooleanField(**{**options, "required": False})
    if annotation is int:
        return forms.IntegerField(**options)
    if annotation is float:
        return forms.FloatField(**options)
    return forms.CharField(**options)


_HUB_SOURCE_PARTS = ("path", "name", "split", "text_column", "probability")


class HubSourcesField(forms.CharField):
    """``data.hub`` as lines of text, “id | configuration | split | text column | probability”: the
    parts after the id may be left out (or, the configuration, left empty) for their defaults."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, list):
            return "\n".join(" | ".join("" if source.get(part) is None else f"{source[part]:g}" if part == "probability"
                                         else str(source[part]) for part in _HUB_SOURCE_PARTS) for source in value)
        return value

    def to_python(self, value: Any) -> list[dict]:
        if isinstance(value, list):
            return value
        sources = []
        for line in (super().to_python(value) or "").splitlines():
            parts = [part.strip() for part in line.split("|")]
            if not any(parts):
                continue
            if len(parts) > len(_HUB_SOURCE_PARTS):
                raise forms.ValidationError(_("“%(line)s” has more than five parts: id | configuration | split | "
                                              "text column | probability.") % {"line": line.strip()})
            sources.append({part: text for part, text in zip(_HUB_SOURCE_PARTS, parts, strict=False)
                            if text or part == "name"})
            if sources[-1].get("name") == "":
                sources[-1]["name"] = None
        return sources


def _config_fields() -> dict[str, tuple[str, forms.Field]]:
    """`{"training__target_batch_size": ("training.target_batch_size", IntegerField), ...}`"""
    fields = {}
    for section in SECTIONS:
        section_model = RunConfig.model_fields[section].annotation
        for name, info in section_model.model_fields.items():
            field = HubSourcesField(required=False) if f"{section}.{name}" == "data.hub" else _form_field(info.annotation, info)
            field.label, field.help_text = FIELDS[f"{section}.{name}"]
            fields[f"{section}__{name}"] = (f"{section}.{name}", field)
    return fields


def _field_of(path: str) -> tuple[str, str]:
    """The form field a configuration error belongs to, and the words that place it there:
    “data.hub.1.split” is the hub sources' field, “Source 2, split: …”."""
    section, _dot, rest = path.partition(".")
    name, _dot, within = rest.partition(".")
    if within:
        number, _dot, part = within.partition(".")
        prefix = _("Source %(number)s") % {"number": int(number) + 1} if number.isdigit() else within
        return f"{section}__{name}", f"{prefix}, {part}: " if part else f"{prefix}: "
    return path.replace(".", "__", 1), ""


class RunForm(forms.Form):
    name = forms.CharField(max_length=100, label=_("Name"),
                           help_text=_("What volunteers will see, e.g. “sahajBERT: Bengali ALBERT”."))
    slug = forms.SlugField(max_length=64, label=_("Slug"),
                           help_text=_("The run's address, and the name agents join by: peer-agent join <slug>."))
    description = forms.CharField(
        required=False, max_length=10000, widget=forms.Textarea(attrs={"rows": 4}), label=_("Description"),
        help_text=_("What the run trains and why."),
    )
    visibility = forms.ChoiceField(choices=Run.Visibility.choices, label=_("Visibility"),
                                   help_text=_("Who may join the run, and whether it is listed."))
    audience = forms.ChoiceField(choices=Run.Audience.choices, initial=Run.Audience.EVERYONE, required=False,
                                 label=_("Audience"), help_text=_("Who may see the run: its pages, API, live board and charts."))
    license = forms.ChoiceField(choices=ModelLicense.choices, initial=ModelLicense.APACHE, required=False, label=_("License"),
                                help_text=_("The license of the released model, in its model card."))
    languages = forms.CharField(required=False, max_length=200, initial="bn, en", label=_("Languages"),
                                help_text=_("ISO 639-1 codes of the languages the model learns, comma-separated (model card)."))
    probe_every = forms.IntegerField(min_value=1, max_value=1000, initial=1, required=False, label=_("Probe every"),
                                     help_text=_("Run the downstream probes on every n-th checkpoint (each costs a fine-tune)."))

    def clean_languages(self) -> list[str]:
        codes = [code.strip().lower() for code in self.cleaned_data["languages"].replace(";", ",").split(",") if code.strip()]
        bad = [code for code in codes if not re.fullmatch(r"[a-z]{2,3}", code)]
        if bad:
            raise forms.ValidationError(_("Not a language code: %(codes)s. Use ISO 639-1 codes such as bn, en.")
                                        % {"codes": ", ".join(bad[:5])})
        return list(dict.fromkeys(codes))

    heldout_size = forms.IntegerField(
        min_value=10, max_value=100_000, required=False, label=_("Held-out size"),
        help_text=_("Documents each checkpoint is evaluated on, which no agent trains on: kept apart from the uploaded "
                    "files, or read from the hub sources (held out by hash, or their validation split)."))
    validation_split = forms.CharField(
        max_length=100, required=False, label=_("Validation split"),
        help_text=_("Hub sources held out by validation split: the split checkpoints are evaluated on. It must "
                    "differ from the training split."))

    start_from = forms.CharField(
        required=False, max_length=300, label=_("Initial weights"),
        help_text=_("Empty: random weights. Or start from trained ones, with their tokenizer: a run's address (its "
                    "newest checkpoint; slug@epoch for another), a folder under the portal's START_MODELS_DIR as "
                    "save_pretrained writes it, or a Hugging Face model id (owner/name). The model must have the "
                    "run's architecture."))

    def clean_audience(self) -> str:
        return self.cleaned_data.get("audience") or (self.run.audience if self.run else Run.Audience.EVERYONE)

    def clean_heldout_size(self) -> int:
        return self.cleaned_data.get("heldout_size") or getattr(self.run, "heldout_size", _HELDOUT_SIZE)

    def clean_validation_split(self) -> str:
        return self.cleaned_data.get("validation_split") or getattr(self.run, "validation_split", _VALIDATION_SPLIT)

    def __init__(self, *args, run: Run | None = None, user: User | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run, self.user = run, user
        self.start_source: StartSource | None = None
        self.start_changed = False
        self.paths = {}
        for name, (path, field) in _config_fields().items():
            self.fields[name] = field
            self.paths[name] = path
        if run is not None:
            self.fields["slug"].disabled = True
            if run.status != Run.Status.DRAFT:
                # Evaluations stay comparable only on one held-out set.
                for name in _HELDOUT_FIELDS:
                    self.fields[name].disabled = True
                self.fields["start_from"].disabled = True  # the swarm has begun from it
                for name, path in self.paths.items():
                    if path not in MID_RUN_EDITABLE:
                        self.fields[name].disabled = True

    @staticmethod
    def initial_from(*, config: RunConfig, run: Run | None = None) -> dict:
        initial = {f"{section}__{name}": value for section, values in config.model_dump(mode="json").items()
                   if isinstance(values, dict) for name, value in values.items()}
        initial["data__hub"] = HubSourcesField().prepare_value(initial["data__hub"])
        initial.update(heldout_size=_HELDOUT_SIZE, validation_split=_VALIDATION_SPLIT)
        if run is not None:
            initial.update(name=run.name, slug=run.slug, description=run.description, visibility=run.visibility,
                           audience=run.audience, license=run.license, languages=", ".join(run.languages),
                           probe_every=run.probe_every, heldout_size=run.heldout_size,
                           validation_split=run.validation_split, start_from=run.started_from)
        return initial

    def run_fields(self) -> list:
        return [self[name] for name in ("name", "slug", "description", "visibility", "audience", "license", "languages",
                                        "probe_every")]

    def card(self) -> dict:
        """The run's model-card metadata and probe cadence, as run_create and run_update take them: those
        the form was sent (a client that predates them changes none)."""
        return {name: self.cleaned_data[name] for name in ("license", "languages", "probe_every")
                if name in self.data and (name == "languages" or self.data[name] != "")}

    def heldout_fields(self) -> list:
        return [self[name] for name in _HELDOUT_FIELDS]

    def start_fields(self) -> list:
        return [self["start_from"]]

    def sections(self) -> list[tuple[str, list]]:
        return [(title, [self[name] for name in self.paths if name.startswith(f"{key}__") and name not in _HELDOUT_FIELDS])
                for key, title in SECTIONS.items()]

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        if self.run is None and Run.objects.filter(slug=slug).exists():
            raise forms.ValidationError(_("Another run already has this address."))
        return slug

    def clean(self) -> dict:
        cleaned = super().clean()
        data: dict[str, dict] = {section: {} for section in SECTIONS}
        for name, path in self.paths.items():
            if name in self.errors:
                return cleaned
            section, key = path.split(".")
            value = cleaned.get(name)
            data[section][key] = None if value == "" else value
        for path, errors in config_error_details(data).items():
            field, prefix = _field_of(path)
            for error in errors:
                self.add_error(field if field in self.fields else None, prefix + error_message(error))
        if not self.errors:
            self.config = RunConfig.model_validate(data)
            split, data = cleaned.get("validation_split"), self.config.data
            if data.source == "hub" and data.heldout == "validation_split" and split in {s.split for s in data.hub}:
                self.add_error("validation_split", f"must differ from the split agents train on ({split}): "
                                                   "evaluating on training data says nothing")
            self._start_clean(cleaned.get("start_from") or "")
        return cleaned

    def _start_clean(self, text: str) -> None:
        """Check "Initial weights" against the configuration: a new source is resolved (the organizer must
        be allowed its checkpoints) into ``start_source``; a kept one is checked again, since the draft's
        model may have been edited."""
        if self.run is not None and self.run.status != Run.Status.DRAFT:
            return
        current = self.run.started_from if self.run else ""
        self.start_changed = text.strip() != current
        if not self.start_changed:
            source = start.run_start_source(self.run) if current else None
        elif not text.strip():
            return
        elif self.user is None or not self.user.is_authenticated:
            self.add_error("start_from", _("Sign in to start a run from trained weights."))
            return
        else:
            try:
                source = self.start_source = start.start_source_resolve(text=text, user=self.user, run=self.run)
            except start.StartError as exc:
                self.add_error("start_from", capfirst(str(exc)) + ".")
                return
        for problem in start.start_mismatches(source, self.config) if source else []:
            self.add_error("start_from", capfirst(problem) + ".")


class ProbeForm(forms.Form):
    """A downstream probe's upload: both parts are read and checked here (runs/setup/probes.py), so a
    refused upload stores nothing and says what to fix."""

    name = forms.SlugField(max_length=64, help_text=_("A short name, e.g. wikiann-bn or news-topics."))
    task = forms.ChoiceField(choices=Probe.Task.choices)
    train = forms.FileField(help_text=_("The part the probe fine-tunes on."))
    test = forms.FileField(help_text=_("The part it is scored on; only labels the train part has."))

    def __init__(self, *args, run: Run, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run = run

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if self.run.probes.filter(name=name).exists():
            raise forms.ValidationError("The run already has a probe with this name.")
        return name

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        parts, self.contents = {}, {}
        for part in ("train", "test"):
            upload = cleaned[part]
            if upload.size > settings.PROBE_MAX_FILE_BYTES:
                limit = settings.PROBE_MAX_FILE_BYTES // 1024
                self.add_error(part, _("The file is larger than %(limit)s KiB.") % {"limit": limit})
                continue
            self.contents[part] = upload.read()
            try:
                parts[part] = probes.labelled_set_read(task=cleaned["task"], content=self.contents[part], part=part)
            except probes.ProbeFormatError as exc:
                self.add_error(part, capfirst(str(exc)) + ".")
        if len(parts) == 2:
            try:
                probes.labelled_sets_check(parts["train"], parts["test"])
            except probes.ProbeFormatError as exc:
                self.add_error("test", capfirst(str(exc)) + ".")
        return cleaned
