"""`tandem-cli serve`: an OpenAI-compatible HTTP server over a ChatEngine (create_app in app.py)."""
