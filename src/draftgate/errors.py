"""Exceptions that reach users. Each message says what went wrong and what to do."""

from __future__ import annotations

__all__ = ["DraftGateError", "ModelLoadError", "BadRequestError", "CapacityError"]


class DraftGateError(Exception):
    """Base class: an error with a message fit for a user (CLI line, HTTP body)."""


class ModelLoadError(DraftGateError):
    """A model file is missing, corrupt or of an unsupported architecture."""


class BadRequestError(DraftGateError, ValueError):
    """A request's input is invalid (HTTP 400 / CLI exit 2)."""


class CapacityError(DraftGateError):
    """The engine cannot take the request now (KV blocks or queue full)."""
