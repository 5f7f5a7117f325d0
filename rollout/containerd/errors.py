"""Errors of the containerd config engine, all rooted at RolloutError."""

from __future__ import annotations

from rollout.errors import BadInput, ExitCode, RolloutError


class ContainerdConfigError(RolloutError):
    """Root of the errors the containerd config engine raises on purpose."""


class VersionUnknown(ContainerdConfigError, BadInput):
    """`containerd --version` output, or a config `version` key, rollout cannot read."""

    exit_code = ExitCode.BAD_INPUT


class UnsupportedVersion(ContainerdConfigError):
    """A containerd release or config version rollout has no merge model for."""


class ConfigParseError(ContainerdConfigError, BadInput):
    """A config file is not valid TOML (containerd would refuse to start)."""

    exit_code = ExitCode.BAD_INPUT


class ImportMissing(ContainerdConfigError):
    """An `imports` entry names a file that is not there; containerd 1.x refuses to start."""


class UnknownCriSetting(ContainerdConfigError, BadInput):
    """An intent key rollout cannot place in the CRI plugin tables of a containerd version."""

    exit_code = ExitCode.BAD_INPUT


class SynthesisError(ContainerdConfigError):
    """No set of file writes rollout knows makes the effective config equal to the intent."""


class PredictionRefused(ContainerdConfigError):
    """The real `containerd config dump` of the candidate files changes more than the intent."""


class StagingFailed(ContainerdConfigError):
    """Staging config files on the target machine, or dumping them, failed."""
