"""The errors sim raises to its callers, in a module without torch so the command line can catch
them without importing the simulators."""

from __future__ import annotations

__all__ = ["EnvironmentUnavailable", "StatesNotRecorded"]


class EnvironmentUnavailable(RuntimeError):
    """An environment whose simulator needs a package this install lacks (an optional extra).

    The message names the environment, the missing package and the pip command that adds it;
    the command line prints it as one line and exits 2.
    """

    def __init__(self, environment: str, package: str, extra: str) -> None:
        self.environment, self.package, self.extra = environment, package, extra
        super().__init__(
            f"environment {environment!r} needs {package} (not installed): "
            f"pip install 'cbo-agent[{extra}]' (the service image leaves this extra out)"
        )


class StatesNotRecorded(ValueError):
    """`--send-states` (`DeviceSettings.send_states`) for an environment whose episodes do not
    record the states they visit; the command line prints it as one line and exits 2."""

    def __init__(self, environment: str) -> None:
        self.environment = environment
        super().__init__(
            f"--send-states: environment {environment!r} does not record the states its "
            "episodes visit (the episode environments do: mpe-tag*, mamujoco-*)"
        )
