"""Run forms. The configuration fields are generated from `peer_agent.protocol.RunConfig`, which
also validates them: the browser form and the agent can never disagree on what a config is."""

import re
import types
import typing
from typing import Any, Literal

from django import forms
from django.conf import settings
from django.utils.text import capfirst

from peer_agent.protocol import MID_RUN_EDITABLE, RunConfig, config_errors, config_from_preset
from runs.models import ModelLicense, Probe, Run
from runs.setup import probes

SECTIONS = {
    "model": "Model",
    "tokenizer": "Tokenizer",
    "data": "Data",
    "training": "Training",
    "averaging": "Averaging and checkpoints",
    "verification": "Credit verification",
}
PRESETS = {
    "tiny": "tiny: a ~2M-parameter ALBERT that trains on laptop CPUs (demo)",
    "base": "base: ALBERT-base shape",
    "large": "large: sahajBERT, ALBERT-large with shared layers, ~18M parameters",
    "xlarge": "xlarge: ALBERT-xlarge shape",
}
# A tiny run should show progress within minutes on CPUs, on text the organizer uploads.
_TINY_OVERRIDES = {
    "tokenizer": {"vocab_size": 4000, "sample_size": 20000},
    "data": {"source": "files", "path": None, "name": None, "max_seq_length": 128, "shuffle_buffer": 1000},
    "training": {"target_batch_size": 64, "per_device_batch_size": 8, "warmup_steps": 20, "total_steps": 5000},
    "averaging": {"matchmaking_time": 2.0, "averaging_timeout": 30.0, "checkpoint_every_epochs": 5,
                  "checkpoint_every_minutes": 10.0},
}

_HELDOUT_SIZE = Run._meta.get_field("heldout_size").default
_VALIDATION_SPLIT = Run._meta.get_field("validation_split").default


def preset_config(preset: str) -> RunConfig:
    return config_from_preset(preset, **(_TINY_OVERRIDES if preset == "tiny" else {}))


def _form_field(annotation: Any, info) -> forms.Field:
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        optional, annotation = True, args[0]
    options = {"required": not optional, "help_text": info.description or "", "label": capfirst(info.title or "")}
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


def _config_fields() -> dict[str, tuple[str, forms.Field]]:
    """`{"training__target_batch_size": ("training.target_batch_size", IntegerField), ...}`"""
    fields = {}
    for section in SECTIONS:
        section_model = RunConfig.model_fields[section].annotation
        for name, info in section_model.model_fields.items():
            field = _form_field(info.annotation, info)
            field.label = capfirst(name.replace("_", " "))
            fields[f"{section}__{name}"] = (f"{section}.{name}", field)
    return fields


class RunForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What volunteers will see, e.g. “sahajBERT: Bengali ALBERT”.")
    slug = forms.SlugField(max_length=64, help_text="The run's address, and the name agents join by: peer-agent join <slug>.")
    description = forms.CharField(
        required=False, max_length=10000, widget=forms.Textarea(attrs={"rows": 4}), help_text="What the run trains and why."
    )
    visibility = forms.ChoiceField(choices=Run.Visibility.choices, help_text="Who may join the run, and whether it is listed.")
    audience = forms.ChoiceField(choices=Run.Audience.choices, initial=Run.Audience.EVERYONE, required=False,
                                 help_text="Who may see the run: its pages, API, live board and charts.")
    license = forms.ChoiceField(choices=ModelLicense.choices, initial=ModelLicense.APACHE, required=False,
                                help_text="The license of the released model, in its model card.")
    languages = forms.CharField(required=False, max_length=200, initial="bn, en",
                                help_text="ISO 639-1 codes of the languages the model learns, comma-separated (model card).")
    probe_every = forms.IntegerField(min_value=1, max_value=1000, initial=1, required=False,
                                     help_text="Run the downstream probes on every n-th checkpoint (each costs a fine-tune).")

    def clean_languages(self) -> list[str]:
        codes = [code.strip().lower() for code in self.cleaned_data["languages"].replace(";", ",").split(",") if code.strip()]
        bad = [code for code in codes if not re.fullmatch(r"[a-z]{2,3}", code)]
        if bad:
            raise forms.ValidationError(f"Not a language code: {', '.join(bad[:5])}. Use ISO 639-1 codes such as bn, en.")
        return list(dict.fromkeys(codes))

    heldout_size = forms.IntegerField(
        min_value=10, max_value=100_000, required=False, label="Held-out size",
        help_text="Documents kept apart from the uploaded files to evaluate each checkpoint on (no agent trains on "
                  "them), or documents read from the validation split of a hub dataset.")
    validation_split = forms.CharField(
        max_length=100, required=False, label="Validation split",
        help_text="Hub datasets only: the split checkpoints are evaluated on. It must differ from the training split.")

    def clean_audience(self) -> str:
        return self.cleaned_data.get("audience") or (self.run.audience if self.run else Run.Audience.EVERYONE)

    def clean_heldout_size(self) -> int:
        return self.cleaned_data.get("heldout_size") or getattr(self.run, "heldout_size", _HELDOUT_SIZE)

    def clean_validation_split(self) -> str:
        return self.cleaned_data.get("validation_split") or getattr(self.run, "validation_split", _VALIDATION_SPLIT)

    def __init__(self, *args, run: Run | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.paths = {}
        for name, (path, field) in _config_fields().items():
            self.fields[name] = field
            self.paths[name] = path
        if run is not None:
            self.fields["slug"].disabled = True
            if run.status != Run.Status.DRAFT:
                # Evaluations stay comparable only on one held-out set.
                self.fields["heldout_size"].disabled = self.fields["validation_split"].disabled = True
                for name, path in self.paths.items():
                    if path not in MID_RUN_EDITABLE:
                        self.fields[name].disabled = True

    @staticmethod
    def initial_from(*, config: RunConfig, run: Run | None = None) -> dict:
        initial = {f"{section}__{name}": value for section, values in config.model_dump(mode="json").items()
                   if isinstance(values, dict) for name, value in values.items()}
        initial.update(heldout_size=_HELDOUT_SIZE, validation_split=_VALIDATION_SPLIT)
        if run is not None:
            initial.update(name=run.name, slug=run.slug, description=run.description, visibility=run.visibility,
                           audience=run.audience, license=run.license, languages=", ".join(run.languages),
                           probe_every=run.probe_every, heldout_size=run.heldout_size,
                           validation_split=run.validation_split)
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
        return [self["heldout_size"], self["validation_split"]]

    def sections(self) -> list[tuple[str, list]]:
        return [(title, [self[name] for name in self.paths if name.startswith(f"{key}__")]) for key, title in SECTIONS.items()]

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        if self.run is None and Run.objects.filter(slug=slug).exists():
            raise forms.ValidationError("Another run already has this address.")
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
        for path, messages in config_errors(data).items():
            field = path.replace(".", "__", 1)
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
        if not self.errors:
            self.config = RunConfig.model_validate(data)
            split = cleaned.get("validation_split")
            if self.config.data.source == "hub" and split == self.config.data.split:
                self.add_error("validation_split", f"must differ from the split agents train on ({split}): "
                                                   "evaluating on training data says nothing")
        return cleaned


class ProbeForm(forms.Form):
    """A downstream probe's upload: both parts are read and checked here (runs/setup/probes.py), so a
    refused upload stores nothing and says what to fix."""

    name = forms.SlugField(max_length=64, help_text="A short name, e.g. wikiann-bn or news-topics.")
    task = forms.ChoiceField(choices=Probe.Task.choices)
    train = forms.FileField(help_text="The part the probe fine-tunes on.")
    test = forms.FileField(help_text="The part it is scored on; only labels the train part has.")

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
                self.add_error(part, f"The file is larger than {settings.PROBE_MAX_FILE_BYTES // 1024} KiB.")
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
