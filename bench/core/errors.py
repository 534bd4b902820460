"""Errors a user can cause. The CLI prints them in one line and exits with status 2."""

from __future__ import annotations


class LeakbenchError(Exception):
    """Base class of every error caused by user input (config, names, parameters, data)."""


class ConfigError(LeakbenchError):
    """A config value is missing, of the wrong type or out of range."""


class UnknownNameError(LeakbenchError):
    """A dataset, model, attack or defense name is not registered."""


class DataError(LeakbenchError):
    """A data source is missing, unreachable or corrupt."""
