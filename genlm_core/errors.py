"""Exceptions shared by modules that must not import each other (no imports of its own)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration could not be built: the message says what to change."""
