"""Exit statuses of the ``peer-agent`` command.

0 when training stopped as asked (Ctrl-C, SIGTERM, ``--max-runtime``), 1 on an unexpected failure,
2 when a setting or the agent token is wrong, 3 when the portal ended the session (run finished,
banned, token revoked, ...).
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
