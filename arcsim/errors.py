"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class ArcsimError(Exception):
    """Bad input or an impossible request; the message says what is wrong and how to fix it."""

    exit_code = 2


class UnitError(ArcsimError):
    """A size, rate or duration string that cannot be read."""


class TopologyError(ArcsimError):
    """An unknown, malformed or impossible topology."""


class CollectiveError(ArcsimError):
    """An unknown operation or algorithm, or one that does not apply."""


class CompressionError(ArcsimError):
    """Bad compressor input: density, rank, shapes, non-finite gradients, unknown names."""
