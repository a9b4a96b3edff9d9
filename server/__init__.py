"""lucebox's HTTP server: OpenAI-compatible (chat completions, completions, models), Anthropic
Messages and OpenAI Responses endpoints over one `lucebox.Engine`.

Installed as `lucebox.server` (the wheel maps the source tree's server/ there). Importing it
imports FastAPI; the core package never does (``lucebox serve`` imports it lazily).

    from lucebox.server import ServerConfig, create_app
    app = create_app(ServerConfig(model="model.gguf", slots=2))
"""
from __future__ import annotations

from .app import create_app, load_engine
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app", "load_engine"]
