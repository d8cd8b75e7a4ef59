"""Entry point of the ``tuner`` console script."""

from __future__ import annotations

import typer

from cli import db, demo, devices, fleet, measure, models, records, serve, templates, tune, worker

app = typer.Typer(
    name="tuner",
    help="AutoTVM-style kernel tuning: templates, devices, measurements, models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("devices")(devices.devices)
app.command("space")(templates.space)
app.command("codegen")(templates.codegen)
app.command("measure")(measure.measure)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("tune")(tune.tune)
app.command("worker")(worker.worker)
app.command("jobs")(fleet.jobs)
app.command("job")(fleet.job)
app.command("workers")(fleet.workers)
app.command("cancel")(fleet.cancel)
app.command("tasks")(models.tasks)
app.command("compile")(models.compile_model)
app.command("run")(models.run_model)
app.add_typer(db.db_app, name="db")
app.add_typer(db.token_app, name="token")
app.add_typer(records.records_app, name="records")


if __name__ == "__main__":
    app()
