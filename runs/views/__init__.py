"""HTML pages: what everyone sees (``pages``), the organizer's (``organizer``) and a run's health
page (``health``)."""
