"""Admission: a record accepted (journaled, then pushed) onto its line's bounded Redis
queue, in the order its line's records came, with each line's overflow policy."""
