"""Operating a run's hivemind swarm: the coordinator and its backbone peer (``coordinator``), the DHT
monitor (``monitor``), the check of reports against it (``verification``), checkpoints
(``checkpoints``), the run's health (``health``) and its time series (``series``).

``coordinator``, ``monitor`` and ``checkpoints`` import hivemind and torch; they run only in the
coordinator process (``manage.py run_coordinator``). The other modules here are light: the web tier
reads them.
"""
