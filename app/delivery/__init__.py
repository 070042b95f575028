"""Delivery: the attempt engine (claim, deliver, record the outcome), its sinks, the
circuit and limits that pace it, and pausing a line."""
