"""The FastAPI app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
)
from fastapi.staticfiles import StaticFiles
from sqlalchemy import func, select, text
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.api import Health, Readiness
from schemas.text import describe, one_line
from tuner_server.access_log import access_log_deferred, redact_access_log
from tuner_server.api import dashboard as dashboard_api
from tuner_server.api import jobs, records, workers
from tuner_server.api.hot import Shortcuts
from tuner_server.db.models import RecordRow
from tuner_server.db.session import (
    POOL_SIZE,
    READER_CONNECTIONS,
    ConnectionBudgetError,
    check_schema,
    connection_share,
    make_engine,
    reader_engine,
    session_factory,
    split_connections,
)
from tuner_server.gc_pause import freeze_startup
from tuner_server.middleware import MAX_DETAIL_CHARS, Guard, outage_reason, refusal
from tuner_server.queue import QueueUnavailable, make_queue
from tuner_server.services.dispatch import workers_alive
from tuner_server.services.metrics import METRICS_CONTENT_TYPE, Metrics
from tuner_server.services.model_view import ModelViews
from tuner_server.services.scheduler import PassStats, Scheduler
from tuner_server.services.tokens import TokenCache, ensure_token
from tuner_server.settings import Settings

# The dashboard's static files ship inside the package (pyproject's package-data).
DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
# Revalidate each time (cheap: an ETag): a server upgrade must not leave an old app.js.
NO_CACHE = {"Cache-Control": "no-cache"}
# Swagger UI's and ReDoc's scripts ship in the fastapi-offline package: /docs works
# without reaching a CDN.
DOCS_ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"

def _redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def create_app(settings: Settings | None = None,
               quiet: AbstractContextManager[object] | None = None) -> FastAPI:
    """Build the app; refuses a database whose schema this code does not know.
    ``quiet``: the lock an embedded worker holds while it times a kernel (``Scheduler``)."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    check_schema(engine, settings.database_url)
    reader_connections = READER_CONNECTIONS
    if engine.dialect.name == "postgresql":  # this process's share of the connections
        try:
            share = connection_share(engine, settings.server_processes,
                                     settings.db_connections)
        except ConnectionBudgetError:
            engine.dispose()
            raise
        pool, reader_connections = split_connections(share)
        if pool != POOL_SIZE:
            engine.dispose()
            engine = make_engine(settings.database_url, pool)
    sessions = session_factory(engine)
    reader = reader_engine(engine, reader_connections)
    if settings.worker_token:
        with sessions.begin() as session:
            ensure_token(session, settings.worker_token, "worker", "bootstrap")
    queue = make_queue(settings.queue_url, settings.redis_prefix)
    try:
        queue.ping()  # a server without its queue would accept jobs it cannot hand out
    except QueueUnavailable as err:
        engine.dispose()
        reader.dispose()
        raise QueueUnavailable(f"the queue at {_redacted(settings.queue_url)} does not "
                               f"answer ({err}); start it, or use --queue-url sql") from None
    metrics = Metrics()

    def on_pass(stats: PassStats) -> None:
        metrics.expired(stats.requeued + stats.given_up)

    scheduler = Scheduler(sessions, queue, settings.scheduler_interval, on_pass, quiet)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        freeze_startup()
        with access_log_deferred():  # uvicorn has configured its loggers by now
            if settings.run_scheduler:
                scheduler.start()
            yield
            if settings.run_scheduler:
                scheduler.stop()
            engine.dispose()
            reader.dispose()

    # FastAPI's native OpenTelemetry is off: the service reports through /metrics, and
    # the check whether a provider is configured read the environment on every request
    # (a tenth of a lease call's CPU in py-spy).
    app = FastAPI(title="tuner", version="0.1.0", lifespan=lifespan,
                  description="AutoTVM-style tuning service: records, jobs, workers.",
                  docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.add_middleware(Shortcuts, state=app.state)  # inside Guard: added first
    app.add_middleware(Guard, large_paths=records.LARGE_BODY_PATHS)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.readers = session_factory(reader)  # deps.get_reader
    app.state.tokens = TokenCache(sessions)
    app.state.queue = queue
    app.state.metrics = metrics
    app.state.scheduler = scheduler
    app.state.model_views = ModelViews()  # each job's model view, extended per call
    app.state.read_only = False  # the local dashboard's app (tuner dashboard) sets it
    app.include_router(dashboard_api.router)
    app.include_router(jobs.router)
    app.include_router(workers.router)
    app.include_router(records.router)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable sentence per problem, naming the field, instead of a bare 422 dump;
        # the first few problems only, so a thousand bad items still answer in one line.
        errors = exc.errors()
        problems = [describe(e) for e in errors[:3]]
        if len(errors) > 3:
            problems.append(f"and {len(errors) - 3} more")
        return JSONResponse({"detail": one_line("; ".join(problems), MAX_DETAIL_CHARS)},
                            status_code=422)

    app.add_exception_handler(StarletteHTTPException, refusal)

    # The dashboard: the page and its assets carry no data, so they need no token; the
    # API calls it makes do. A token an old /?token= link carries stays out of the log.
    redact_access_log()
    app.mount("/static", StaticFiles(directory=DASHBOARD_DIR), name="static")

    # Routes without database work are async: they answer on the event loop, no thread.
    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD_DIR / "index.html", headers=NO_CACHE)

    # API docs, their scripts served from the package (no CDN)
    app.mount("/docs-assets", StaticFiles(directory=DOCS_ASSETS), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="tuner API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="tuner API",
                              redoc_js_url="/docs-assets/redoc.standalone.js",
                              redoc_favicon_url="/docs-assets/favicon.png",
                              with_google_fonts=False)

    @app.get("/healthz", include_in_schema=False, response_model=Health)
    async def healthz() -> Health:
        """Liveness: the process answers (readiness is /readyz)."""
        return Health(status="ok")

    @app.get("/readyz", include_in_schema=False, response_model=Readiness,
             responses={503: {"model": Readiness}})
    def readyz(request: Request) -> JSONResponse:
        """Readiness: the database and the queue both answer."""
        state = {"database": "ok", "queue": "ok"}
        try:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as err:  # noqa: BLE001 - any failure means "not ready"
            state["database"] = f"unavailable: {outage_reason(err)}"
        try:
            request.app.state.queue.ping()
        except Exception as err:  # noqa: BLE001
            state["queue"] = f"unavailable: {outage_reason(err)}"
        ready = all(v == "ok" for v in state.values())
        answer = Readiness(status="ok" if ready else "unavailable", **state)
        return JSONResponse(answer.model_dump(), status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> PlainTextResponse:
        """This process's view of the fleet: counters summed over the server processes
        (services.metrics), gauges read from the database and the queue."""
        with sessions() as session:
            count = session.scalar(select(func.count()).select_from(RecordRow)) or 0
            text = metrics.render(queue.depth(session),
                                  workers_alive(session, settings.lease_seconds), count)
        return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE)

    return app
