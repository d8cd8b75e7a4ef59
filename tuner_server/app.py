"""The FastAPI app factory."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import func, select

from tuner_server.api import records
from tuner_server.db.models import RecordRow
from tuner_server.db.session import check_schema, make_engine, session_factory
from tuner_server.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; refuses a database whose schema this code does not know."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    check_schema(engine, settings.database_url)
    app = FastAPI(title="tuner", version="0.1.0",
                  description="AutoTVM-style tuning service: records, jobs, workers.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.include_router(records.router)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable sentence per problem, naming the field, instead of a bare 422 dump.
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(problems)}, status_code=422)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        with app.state.sessions() as session:
            count = session.scalar(select(func.count()).select_from(RecordRow)) or 0
        return PlainTextResponse(f"# TYPE tuner_records gauge\ntuner_records {count}\n")

    return app
