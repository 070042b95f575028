"""The HTTP intake."""
