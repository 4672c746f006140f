"""The Prometheus metrics the portal's processes count as things happen (docs/deploy.md, "Metrics").

Every process (web, Celery worker, coordinator) counts into these objects. With
``PROMETHEUS_MULTIPROC_DIR`` set, prometheus_client keeps each process's values in files in that
folder and ``/metrics`` (portal/scrape.py) adds them up, so several uvicorn and Celery workers
report one view. The figures of each active run are read from the database at scrape time
(runs/swarm/gauges.py), which is right whichever process changed them.

Labels stay bounded: routes, task names, refusal codes and run slugs, never a volunteer or a session.
"""

import atexit
import os

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.multiprocess import mark_process_dead

# Seconds: an ack waits for a batched database write (runs/ingest/reports.py, ReportWriter).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The credit rollup takes up to CREDIT_ROLLUP_BATCH events per batch: from milliseconds to a minute.
BATCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # A process that exits takes its "live" gauges (open sockets) with it. The pid is read at exit:
    # a forked Celery child inherits this hook and must drop its own files, not its parent's.
    atexit.register(lambda: mark_process_dead(os.getpid()))

# "livesum": the sockets of the processes alive now, added up.
AGENT_SOCKETS_OPEN = Gauge("dedloc_agent_sockets_open", "Open agent sockets (WS /ws/agent/).", multiprocess_mode="livesum")
VIEWER_SOCKETS_OPEN = Gauge("dedloc_viewer_sockets_open", "Open live run page sockets (WS /ws/runs/<slug>/live/).",
                            multiprocess_mode="livesum")

REPORTS_ACCEPTED = Counter("dedloc_reports_accepted", "Contribution reports stored (a resent one counts once).")
REPORTS_REFUSED = Counter("dedloc_reports_refused", "Report frames answered with an error frame, by its code.", ["code"])
INGEST_ACK_SECONDS = Histogram("dedloc_ingest_ack_seconds", "From a report frame's arrival to its ack.",
                               buckets=LATENCY_BUCKETS)

ROLLUP_BATCH_SECONDS = Histogram("dedloc_credit_rollup_batch_seconds", "Duration of one credit rollup batch.",
                                 buckets=BATCH_BUCKETS)

CELERY_TASK_RUNS = Counter("dedloc_celery_task_runs", "Celery tasks run, by task.", ["task"])
CELERY_TASK_FAILURES = Counter("dedloc_celery_task_failures", "Celery tasks that raised, by task.", ["task"])

CHECKPOINTS_SAVED = Counter("dedloc_checkpoints_saved", "Checkpoints the coordinator saved, by run.", ["run"])
CHECKPOINT_FAILURES = Counter("dedloc_checkpoint_failures", "Checkpoint attempts that failed, by run.", ["run"])

HTTP_REQUESTS = Counter("dedloc_http_requests", "HTTP requests answered, by route pattern, method and status.",
                        ["route", "method", "status"])
# Answers of the API sent from a snapshot (portal/snapshots.py) never reach Django, nor HTTP_REQUESTS above.
SNAPSHOTS = Counter("dedloc_http_snapshots", "Anonymous API reads: answers sent from a snapshot (sent) or read afresh "
                    "by Django while a snapshot could have been sent (read).", ["outcome"])
HTTP_REQUEST_SECONDS = Histogram("dedloc_http_request_duration_seconds", "Time to answer an HTTP request, by route pattern.",
                                 ["route"], buckets=LATENCY_BUCKETS)
