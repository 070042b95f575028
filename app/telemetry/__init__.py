"""What the record's path emits, below delivery: the logs, the alerts (vocabulary, webhooks,
throttle, incidents), the counters every process folds into Redis, and tracing."""
