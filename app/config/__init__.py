"""Configuration: the settings read from `PIPELINE_` environment variables and the optional
TOML file (`settings.py`, whose `load_settings()` is the only way in and which names the
known variable closest to an unknown one), the checks of their parts (a line's and a sink's
settings, the journal's database URL, Redis and Sentinel URLs, intake keys and tokens), and
the scan of an environment for the variables no setting reads (`names.py`)."""
