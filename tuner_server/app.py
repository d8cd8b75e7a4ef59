"""The FastAPI app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import func, select

from tuner_server.api import jobs, records, workers
from tuner_server.db.models import RecordRow
from tuner_server.db.session import check_schema, make_engine, session_factory
from tuner_server.queue import make_queue
from tuner_server.services.dispatch import workers_alive
from tuner_server.services.metrics import Metrics
from tuner_server.services.scheduler import PassStats, Scheduler
from tuner_server.services.tokens import ensure_token
from tuner_server.settings import Settings

# The dashboard's static files ship inside the package (pyproject's package-data).
DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
# Revalidate each time (cheap: an ETag): a server upgrade must not leave an old app.js.
NO_CACHE = {"Cache-Control": "no-cache"}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; refuses a database whose schema this code does not know."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    check_schema(engine, settings.database_url)
    sessions = session_factory(engine)
    if settings.worker_token:
        with sessions.begin() as session:
            ensure_token(session, settings.worker_token, "worker", "bootstrap")
    queue = make_queue(settings.queue_url, settings.redis_prefix)
    metrics = Metrics()

    def on_pass(stats: PassStats) -> None:
        metrics.expired(stats.requeued + stats.given_up)

    scheduler = Scheduler(sessions, queue, settings.scheduler_interval, on_pass)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.run_scheduler:
            scheduler.start()
        yield
        if settings.run_scheduler:
            scheduler.stop()
        engine.dispose()

    app = FastAPI(title="tuner", version="0.1.0", lifespan=lifespan,
                  description="AutoTVM-style tuning service: records, jobs, workers.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.queue = queue
    app.state.metrics = metrics
    app.state.scheduler = scheduler
    app.include_router(jobs.router)
    app.include_router(workers.router)
    app.include_router(records.router)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable sentence per problem, naming the field, instead of a bare 422 dump.
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(problems)}, status_code=422)

    # The dashboard: the page and its assets carry no data, so they need no token; the
    # API calls it makes do.
    app.mount("/static", StaticFiles(directory=DASHBOARD_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD_DIR / "index.html", headers=NO_CACHE)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> PlainTextResponse:
        with sessions() as session:
            count = session.scalar(select(func.count()).select_from(RecordRow)) or 0
            text = metrics.render(queue.depth(session), workers_alive(session), count)
        return PlainTextResponse(text)

    return app
