"""The one base of every error meant for the person running hpctrain (not a bug in it)."""


class UserError(Exception):
    """A problem the user can fix; its message names it and the fix. The CLI prints it as one line."""


class LaunchError(UserError, RuntimeError):
    """A job that cannot be planned, submitted or continued, with the fix in the message."""
