"""Observing the pipeline: alerts (vocabulary, webhooks, throttle), telemetry, metrics, the
per-line view, the monitor, worker liveness."""
