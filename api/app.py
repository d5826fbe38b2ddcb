"""The FastAPI application: ``create_app(settings)``; ``api.app:app`` for uvicorn."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from api import errors, serving
from api.gate import RequestGate, access_table
from api.routes import configs, devices, health, jobs, kernels, measured, misses, stored
from api.validation import HostileInputGuard
from db.engine import close_engine, init_db
from search_spaces import get_kernel, kernel_names
from tuner.app.dispatch import make_dispatcher
from tuner.settings import Settings

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.parsed_api_keys():
            log.warning("no API keys are configured (TUNER_API_KEYS): anyone who can reach "
                        "this API can submit and cancel jobs")
        app.state.session_factory = init_db(settings.resolved_database_url,
                                            bounds=settings.database_bounds)
        app.state.dispatcher = make_dispatcher(settings, app.state.session_factory)
        # imports torch and triton now, not on the first request
        registered = [get_kernel(name) for name in kernel_names()]
        # every stored best in memory: lookups go on answering while the database is away
        index = serving.ServingIndex(app.state.session_factory, settings.serving_refresh_s)
        index.load_all(registered)
        app.state.serving_index = index
        # Everything loaded so far (torch, triton, the app) lives as long as the process: keep
        # it out of the garbage collector's full passes, which otherwise walk it all and made
        # one request in ten on a 5,000-trial job page 3x slower (bench/NOTES.md, Dashboard).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            index.close()
            app.state.dispatcher.close()
            # this process's connections; a SQLite store's log checkpointed into its file
            close_engine(settings.resolved_database_url)

    assets = docs_assets()
    # with the assets installed, /docs and /redoc are this app's own (_mount_docs)
    app = FastAPI(title="triton-tuner", version="0.1.0", lifespan=lifespan,
                  description="Autotuning service for Triton kernels",
                  docs_url=None if assets else "/docs", redoc_url=None if assets else "/redoc")
    app.state.settings = settings
    api = APIRouter(prefix=API_PREFIX)
    routers = [m.router for m in (jobs, configs, stored, measured, misses, kernels, devices)]
    for router in routers:
        api.include_router(router)
    app.include_router(api)
    app.include_router(health.router)
    errors.install(app)
    app.add_middleware(HostileInputGuard)  # NUL, surrogates, NaN: a 422 before any route
    serving.install(app)  # Server-Timing on every response
    # outermost: the host, keys and the body limit before any body is read
    app.add_middleware(RequestGate, routes=access_table(API_PREFIX, routers),
                       hosts=settings.parsed_allowed_hosts())
    _document(app)
    if assets:
        _mount_docs(app, assets)
    _mount_dashboard(app)
    return app


def _document(app: FastAPI) -> None:
    """The OpenAPI document, completed once built: GET /configs's dimensions, which depend on
    the kernels registered (``configs.document_dimensions``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            configs.document_dimensions(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


#: where the API pages' scripts and styles are served (the dashboard's are at /static)
DOCS_STATIC = "/docs-static"
#: the image ReDoc's script loads from another host (its "API docs by Redocly" link's logo),
#: and what it shows instead: an empty image, no request
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
BLANK_IMAGE = "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


def docs_assets() -> Path | None:
    """Swagger UI's and ReDoc's scripts and styles as shipped in the installed
    ``fastapi-offline`` package (a dependency), or None without it: then /docs and /redoc are
    FastAPI's own, which load them from a CDN."""
    try:
        import fastapi_offline
    except ImportError:
        logging.getLogger(__name__).warning("fastapi-offline is not installed: /docs loads "
                                            "Swagger UI from a CDN")
        return None
    path = Path(fastapi_offline.__file__).resolve().parent / "static"
    return path if (path / "swagger-ui-bundle.js").is_file() else None


def _mount_docs(app: FastAPI, assets: Path) -> None:
    """/docs (Swagger UI) and /redoc with every file they load served by this app: they work
    on a machine with no network, as GPU clusters often are (the dashboard serves Plotly the
    same way)."""
    redoc_js = (assets / "redoc.standalone.js").read_text(encoding="utf-8").replace(
        REDOC_LOGO, BLANK_IMAGE)

    # ReDoc's script as shipped loads its sidebar's logo from cdn.redoc.ly: served without it
    # (registered before the mount, which would serve the file as shipped)
    @app.get(f"{DOCS_STATIC}/redoc.standalone.js", include_in_schema=False)
    async def redoc_script() -> Response:
        return Response(redoc_js, media_type="text/javascript")

    app.mount(DOCS_STATIC, StaticFiles(directory=str(assets)), name="docs-static")
    title = app.title

    def static(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{DOCS_STATIC}/{name}"

    def openapi_url(request: Request) -> str:
        return f"{request.scope.get('root_path', '')}{app.openapi_url}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url(request), title=f"{title} - API",
            swagger_js_url=static(request, "swagger-ui-bundle.js"),
            swagger_css_url=static(request, "swagger-ui.css"),
            swagger_favicon_url=static(request, "favicon.png"), oauth2_redirect_url=None,
            swagger_ui_parameters=app.swagger_ui_parameters)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url(request), title=f"{title} - ReDoc",
                              redoc_js_url=static(request, "redoc.standalone.js"),
                              redoc_favicon_url=static(request, "favicon.png"),
                              with_google_fonts=False)


def _mount_dashboard(app: FastAPI) -> None:
    import importlib

    # The dashboard needs jinja2 (a dependency); without it (a minimal image) the API runs alone.
    try:
        dashboard = importlib.import_module("api.dashboard")
        extra = importlib.import_module("api.dashboard_extra")
    except ImportError as exc:
        logging.getLogger(__name__).warning("dashboard off: %s", exc)
        return
    dashboard.install(app)
    app.include_router(extra.router)  # /dashboard/stale, /dashboard/compare


def __getattr__(name: str) -> Any:
    # ``uvicorn api.app:app`` builds the app from the environment on first access only, so
    # importing this module (tests, tools) never reads settings or opens a database.
    if name == "app":
        from tuner.app.supervision import exit_with_serve

        exit_with_serve()  # an API process of tuner serve: never outlive it
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
