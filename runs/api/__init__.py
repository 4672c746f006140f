"""The runs API under ``/api/v1/`` (django-ninja): ``routes`` holds the endpoints."""
