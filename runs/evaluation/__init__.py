"""Evaluation of a run's checkpoints: what the Celery worker may import (services.py) and what only
the evaluating child process imports (runner.py, torch and transformers)."""
