"""Typed errors. Each says what was expected, so a caller can act on it."""


class EdgeflowError(Exception):
    """Base class of every error edgeflow raises on purpose."""


class FormatError(EdgeflowError):
    """A `.efl` file (or buffer) is truncated, corrupted, hostile or of another version."""


class InvalidInputError(EdgeflowError, ValueError):
    """An input has the wrong name, dtype or shape; the message names the expected ones."""


class UnsupportedOpError(EdgeflowError):
    """One or more ops are unknown to edgeflow (or to a backend).

    `ops` lists every offending op, not only the first, as (op_type, detail) pairs.
    """

    def __init__(self, message, ops=()):
        super().__init__(message)
        self.ops = list(ops)


class GraphError(EdgeflowError, ValueError):
    """A graph is malformed: incompatible shapes or dtypes, a cycle, a bad attribute."""


class ConversionError(EdgeflowError):
    """A model from another framework could not be converted."""


class PlacementError(EdgeflowError):
    """No placement satisfies the pins and budgets asked for."""


class RemoteError(EdgeflowError):
    """The cloud side failed or could not be reached."""
