"""Running the whole stack on one machine (`pipeline up`): the supervisor, the embedded Redis-
compatible server, Flower's wiring."""
