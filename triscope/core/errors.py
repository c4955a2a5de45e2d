"""Errors meant for the user: printed as one line by the CLI, never a traceback."""


class UserError(Exception):
    """A problem with what the user asked for: printed as one line, exit code 2."""
