"""What reads the pipeline's state, above delivery: the metrics, the per-line view, health,
the monitor, worker liveness and stalls."""
