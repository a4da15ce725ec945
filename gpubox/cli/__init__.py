"""The command line: thin Typer commands that call the core and hand results to a renderer."""
