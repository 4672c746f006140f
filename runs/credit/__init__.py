"""Contribution credit: the rollup of reports into per-volunteer, per-team and per-run aggregates and
the recent average credit (``rollup``), the boards (``boards``, ``live``), volunteer profiles
(``volunteers``) and the daily public statistics (``exports``)."""
