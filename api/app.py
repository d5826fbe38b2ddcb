"""The FastAPI application: ``create_app(settings)``; ``api.app:app`` for uvicorn."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI

from api import errors, serving
from api.routes import configs, devices, health, jobs, kernels, misses
from api.validation import HostileInputGuard
from db.engine import init_db
from search_spaces import get_kernel, kernel_names
from tuner.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.session_factory = init_db(settings.resolved_database_url)
        for name in kernel_names():  # imports torch and triton now, not on the first request
            get_kernel(name)
        # Everything loaded so far (torch, triton, the app) lives as long as the process: keep
        # it out of the garbage collector's full passes, which otherwise walk it all and made
        # one request in ten on a 5,000-trial job page 3x slower (bench/NOTES.md, Dashboard).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    app = FastAPI(title="triton-tuner", version="0.1.0", lifespan=lifespan,
                  description="Autotuning service for Triton kernels")
    app.state.settings = settings
    api = APIRouter(prefix="/api/v1")
    for module in (jobs, configs, misses, kernels, devices):
        api.include_router(module.router)
    app.include_router(api)
    app.include_router(health.router)
    errors.install(app)
    app.add_middleware(HostileInputGuard)  # NUL, surrogates, NaN: a 422 before any route
    serving.install(app)  # Server-Timing on every response
    _mount_dashboard(app)
    return app


def _mount_dashboard(app: FastAPI) -> None:
    import importlib

    # The dashboard needs jinja2 (a dependency); without it (a minimal image) the API runs alone.
    try:
        dashboard = importlib.import_module("api.dashboard")
    except ImportError as exc:
        logging.getLogger(__name__).warning("dashboard off: %s", exc)
        return
    dashboard.install(app)


def __getattr__(name: str) -> Any:
    # ``uvicorn api.app:app`` builds the app from the environment on first access only, so
    # importing this module (tests, tools) never reads settings or opens a database.
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
