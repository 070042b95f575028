"""Celery beat: the pipeline's scheduler. Imports app/; app/ never imports this package."""
