"""What can go wrong talking to a server, each with a message the user can act on."""

from engine.errors import ContextOverflowError, TandemError


class RemoteError(TandemError):
    """The server answered with an error, or a reply could not be read."""


class ServerUnreachableError(RemoteError):
    """No connection, a refused connection, or no answer in time."""


class ServerAuthError(RemoteError):
    """The server wants an API key, or refused the one given (401/403)."""


class ServerBusyError(RemoteError):
    """The server's queue is full (503); trying again shortly usually works."""


class RemoteRequestError(RemoteError):
    """The server refused the request (4xx); the message is the server's."""


class RemoteContextOverflowError(ContextOverflowError, RemoteError):
    """The conversation is longer than the server's model reads."""


class RemoteProtocolError(RemoteError):
    """The server's reply is not in the OpenAI chat-completions format."""
