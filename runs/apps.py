from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Training runs"

    def ready(self) -> None:
        # The receivers that keep cached boards fresh connect on import; at the top, the models would load
        # before the app registry is ready.
        from runs.credit import boards  # noqa: F401
