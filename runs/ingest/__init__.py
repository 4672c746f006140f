"""What agents report over ``WS /ws/agent/``: the socket (``consumers``) and the rules, storage and
acknowledgement of each report (``reports``)."""
