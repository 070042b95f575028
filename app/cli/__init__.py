"""The `pipeline` command line. `app.cli.main` holds the root command (its `main` is the
entry point) and the commands that run the stack; each other module, one command group,
is imported only when its command runs."""
