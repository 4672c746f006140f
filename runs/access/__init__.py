"""Who may see, join, organize and download a run (``rules``), the run authority keys that sign
hivemind access tokens (``authority``), and the training sessions the portal opens for agents
(``sessions``)."""
