"""The one error a user fixes: the command line prints its message on one line and exits 2."""


class UsageError(ValueError):
    """Bad input (a flag, a folder, an experiment) whose message names the fix."""


def usage_errors() -> tuple[type[BaseException], ...]:
    """Every error class whose message is meant for the user as it is: ``UsageError``, a config that
    does not parse or validate (``ConfigError``) and a run input that cannot work (``InputError``)."""
    from seeupo.train.config import ConfigError
    from seeupo.train.stack import InputError

    return UsageError, ConfigError, InputError
