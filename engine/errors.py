"""Errors a user can cause. Each carries a message the user can act on; the GUI and CLI show it as is."""


class TandemError(Exception):
    """Base of every error that is the user's input or environment, not a bug."""


class ModelNotFoundError(TandemError):
    pass


class ModelFormatError(TandemError):
    """A file or folder that is not a loadable model: pickle checkpoints, truncated or corrupt weights."""


class OfflineError(TandemError):
    """A hub id was asked for but the hub cannot be reached."""


class IncompatibleDraftError(TandemError):
    pass


class ContextOverflowError(TandemError):
    pass


class SettingsError(TandemError):
    """A setting out of range, such as K outside 1..16."""


class StorageError(TandemError):
    pass
