"""What an entry point builds once and passes in: the `Runtime` (every part over one
settings object) and the process's CPU priority."""
