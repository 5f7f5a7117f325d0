"""Errors of the containerd config engine, all rooted at RolloutError.

An error about one config file carries that file's path on the node (and the line, where
the parser said), so whoever knows where the file came from (a recorded facts directory, a
live node) can name it; the message itself names the node-side path too, for direct callers.
"""

from __future__ import annotations

from rollout.errors import BadInput, RolloutError


class ContainerdConfigError(RolloutError):
    """Root of the errors the containerd config engine raises on purpose; those that are also
    BadInput (the files or versions given) exit as bad input."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        # the node-side config file the problem is in, when it is in one
        self.path = path
        self.line = line
        self.column = column

    @property
    def detail(self) -> str:
        """The message without its leading `path: `, for callers that name the file themselves."""
        prefix = f"{self.path}: "
        return self.message.removeprefix(prefix) if self.path else self.message


class VersionUnknown(ContainerdConfigError, BadInput):
    """`containerd --version` output, or a config `version` key, rollout cannot read."""


class UnsupportedVersion(ContainerdConfigError, BadInput):
    """A containerd release or config version rollout has no merge model for."""


class ConfigParseError(ContainerdConfigError, BadInput):
    """A config file is not valid TOML (containerd would refuse to start)."""


class ImportMissing(ContainerdConfigError, BadInput):
    """An `imports` entry names a file that is not there; containerd 1.x refuses to start."""


class UnknownCriSetting(ContainerdConfigError, BadInput):
    """An intent key rollout cannot place in the CRI plugin tables of a containerd version."""


class SettingTypeError(ContainerdConfigError, BadInput):
    """A setting whose value containerd cannot load into the field it names (wrong type)."""


class ConfigRejected(ContainerdConfigError, BadInput):
    """containerd itself refuses to load the files (its own `config dump` fails on them)."""


class SynthesisError(ContainerdConfigError):
    """No set of file writes rollout knows makes the effective config equal to the intent."""


class PredictionRefused(ContainerdConfigError):
    """The real `containerd config dump` of the candidate files changes more than the intent."""


class StagingFailed(ContainerdConfigError):
    """Staging config files on the target machine, or dumping them, failed."""
