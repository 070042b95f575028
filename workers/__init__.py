"""Celery tasks and worker-side wiring. Imports app/; app/ never imports this package."""
