"""The journal: one row per accepted unit of work, written before it is enqueued."""
