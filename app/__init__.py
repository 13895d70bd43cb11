"""Tandem's desktop app (PySide6). Qt lives here only; the engine is imported lazily on the worker."""
