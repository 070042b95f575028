"""Recovery: what puts unfinished work back on its queue (the sweeper, lost-message checks,
replay) and retention."""
