"""The durable task pipeline: core (journal, admission, sinks) and the intake service."""
