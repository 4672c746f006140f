"""The run form's fields as a browser posts them, for tests of the run pages."""

from runs.setup.forms import RunForm, preset_config


def run_form_data(preset: str = "tiny", **changes) -> dict:
    initial = RunForm.initial_from(config=preset_config(preset))
    data = {key: value for key, value in initial.items() if value is not None and value is not False}
    data.update(name="Bengali ALBERT", slug="bengali-albert", description="sahajBERT again", visibility="public")
    data.update(changes)
    return data
