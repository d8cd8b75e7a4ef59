"""``tuner worker``: serve a tuning server's trials on a local device."""

from __future__ import annotations

import logging

import typer

from cli.common import fail
from workers.agent import WorkerAgent


def worker(
    server: str = typer.Option(..., "--server", envvar="TUNER_SERVER", help="server URL"),
    token: str = typer.Option(..., "--token", envvar="TUNER_TOKEN", help="a worker token"),
    device: str | None = typer.Option(None, "--device", help="e.g. opencl:0 or cuda:0"),
    name: str | None = typer.Option(None, "--name"),
    batch: int = typer.Option(1, "--batch", min=1, help="trials leased at a time"),
    max_trials: int | None = typer.Option(None, "--max-trials", help="exit after this many"),
) -> None:
    """Register, lease, measure (checked against numpy), report, until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    agent = WorkerAgent(server, token, device, name, batch)
    agent.stop_on_signals()
    try:
        measured = agent.run(max_trials=max_trials)
    except RuntimeError as err:
        fail(str(err), code=1)
    typer.echo(f"measured {measured} trials")
