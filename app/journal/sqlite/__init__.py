"""The SQLite adapter of the journal: its WAL checkpoints and its serialized writers."""
