"""Tandem as a client: `RemoteEngine` answers through an OpenAI-compatible server (Tandem, llama.cpp,
vLLM, SGLang...) behind the same `engine.backend.ChatBackend` interface as a local ChatEngine."""

from engine.remote.client import RemoteEngine

__all__ = ["RemoteEngine"]
