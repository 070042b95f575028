"""Delivery: the bounded push onto a line's queue, accepting a record (journal, then push), the
attempt runner, the sinks, backoff."""
