"""The HTTP intake (DESIGN §7)."""
