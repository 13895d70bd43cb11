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
    """The conversation is longer than the model reads. `facts` says by how much; the message adds
    the advice for the app (a front end with other means, such as the terminal's /new, gives its own)."""

    ADVICE = "Start a new chat or delete earlier messages."

    def __init__(self, facts: str, advice: str = ADVICE):
        super().__init__(f"{facts} {advice}")
        self.facts = facts


class SettingsError(TandemError):
    """A setting out of range, such as K outside 1..16."""


class DeviceError(SettingsError):
    """A device that does not exist here: --device tpu, or cuda on a CPU-only torch."""


class StorageError(TandemError):
    pass


class DiskFullError(StorageError):
    """The disk holding the database or an export is full."""


class ReadOnlyStorageError(StorageError):
    """The database or export location cannot be written to."""


class DatabaseLockedError(StorageError):
    """Another program (often a second Tandem) holds the database."""


class CorruptDatabaseError(StorageError):
    """The file is not a readable SQLite database. `path` can be moved aside with Store.move_aside."""

    def __init__(self, message: str, path):
        super().__init__(message)
        self.path = path


class SchemaTooNewError(StorageError):
    """The database was written by a newer Tandem; it is left untouched."""

    def __init__(self, message: str, path, found: int, supported: int):
        super().__init__(message)
        self.path = path
        self.found = found
        self.supported = supported


class InvalidTextError(TandemError):
    """Text that is not valid Unicode (invalid UTF-8 bytes, a lone surrogate) or holds a NUL character."""


class ImportFormatError(StorageError):
    """A file given to import is not a Tandem export."""


class PromptFileError(TandemError):
    """A benchmark prompt file that is missing or has a malformed line; the message names the line."""
