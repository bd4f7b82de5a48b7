"""Exception types with messages meant for people."""


class EngineError(Exception):
    """Base class: the message is shown to the user as is."""


class InputError(EngineError, ValueError):
    """Bad user input (image, text, parameters)."""


class IndexLoadError(EngineError):
    """An index is missing, damaged or built with another backbone."""


class CheckpointError(EngineError):
    """A checkpoint is missing, damaged or belongs to another backbone."""
