"""What the app and the CLI need of an engine, whether it runs here (ChatEngine) or on a server.

Torch-free, so the GUI thread may import it. `ChatEngine` (engine/session.py) and the remote client
both satisfy `ChatBackend`; the app's test fake is checked against it too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from engine.events import Event, Finished
from engine.settings import SamplingSettings, SpeculationSettings


@runtime_checkable
class ChatBackend(Protocol):
    speculation: SpeculationSettings
    sampling: SamplingSettings

    def prepare(self, progress=None) -> None:
        """Work to do once before the first reply (compilation, calibration), reporting Progress."""

    @property
    def notices(self) -> list[str]:
        """What the user should know about how this engine runs."""

    def respond(
        self,
        messages: list[dict],
        on_event: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Finished:
        """Answers the last user turn of `messages`, streaming events to `on_event`."""
