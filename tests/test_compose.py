"""docker-compose.yml and docker/: the services and profiles, every `tuner` command line they
run (compose commands, the images' scripts and CMDs, README's "Running a fleet") parsed by
the real CLI, the variables documented, the Dockerfiles and their stages present; and
`docker compose config -q` where the compose plugin is installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import typer.main

from cli.main import app

yaml = pytest.importorskip("yaml", reason="pyyaml (the dev extra) reads docker-compose.yml")

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
README = REPO / "README.md"
DOCKER = REPO / "docker"

SERVICES = {"postgres", "redis", "server", "worker-opencl", "worker-cuda", "worker-rocm"}
PROFILES = {"worker-cuda": ["cuda"], "worker-rocm": ["rocm"]}

# Compose interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err},
# $VAR; `$$` is a literal `$` (left for the container's shell).
INTERPOLATION = re.compile(
    r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
SHELL_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}


# -- reading the files ---------------------------------------------------------------

def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def references(value: Any) -> Iterator[tuple[str, str | None, str | None]]:
    """(name, operator, argument) of every interpolated variable in a YAML value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from references(k)
            yield from references(v)
    elif isinstance(value, list):
        for v in value:
            yield from references(v)
    elif isinstance(value, str):
        for m in INTERPOLATION.finditer(value):
            if m.group(0) == "$$":
                continue
            yield (m.group("braced") or m.group("bare"), m.group("op"), m.group("arg"))


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """What compose makes of a value given ``env`` (a required variable left unset reads
    as a placeholder here, where compose would refuse to start)."""
    if isinstance(value, dict):
        return {interpolate(k, env): interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("braced") or m.group("bare"), m.group("op"), m.group("arg")
        have = env.get(name)
        if op in (":-", "-"):
            return have if have or (op == "-" and have is not None) else arg
        if op in (":?", "?"):
            return have if have else f"<{name}>"
        return have or ""

    return INTERPOLATION.sub(one, value)


def env_example() -> dict[str, str]:
    """.env.example's variables (commented out or not) and the values it shows."""
    found = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.match(r"^#?\s*([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def readme_fleet_section() -> str:
    """README's "Running a fleet", up to the next heading (outside code blocks)."""
    lines: list[str] = []
    inside = in_code = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = not in_code and re.match(r"^#{1,6} ", line)
        if heading:
            if inside:
                break
            inside = line.lstrip("#").strip() == "Running a fleet"
        elif inside:
            lines.append(line)
    assert lines, 'README.md has no "Running a fleet" section'
    return "\n".join(lines) + "\n"


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", markdown, re.S | re.M)


# -- shell command lines -------------------------------------------------------------

def shell_commands(script: str) -> Iterator[list[str]]:
    """Each simple command of a POSIX shell script, as its words (quotes removed)."""
    script = re.sub(r"\\\n", " ", script)
    for line in script.splitlines():
        if line.strip().startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        for word in lexer:  # `$(` comes as "...$", "(": a substitution starts a command
            if word in SEPARATORS:
                if command:
                    yield command
                command = []
            else:
                command.append(word)
        if command:
            yield command


def tuner_argv(words: list[str]) -> list[str] | None:
    """The arguments after `tuner` when a command runs it: `tuner ...`, `exec tuner ...`,
    `VAR=x tuner ...`, `docker compose exec [-T] SERVICE tuner ...`; else None."""
    words = list(words)
    while words and (words[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
        words.pop(0)
    if words[:3] == ["docker", "compose", "exec"] or words[:2] == ["docker-compose", "exec"]:
        words = words[3:] if words[0] == "docker" else words[2:]
        while words and words[0].startswith("-"):
            words.pop(0)
        words = words[1:]  # the service
    if words and words[0] == "tuner":
        return words[1:]
    return None


def expand_shell(word: str, env: Mapping[str, str]) -> str:
    return SHELL_VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), word)


def words_of(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(w) for w in value]


def service_command_lines(service: dict[str, Any]) -> list[list[str]]:
    """The `tuner` argument lists a service runs: its entrypoint (when it sets one) then
    its command, directly or as an `sh -c` script. docker/entrypoint.sh (the images'
    `tuner-entrypoint`) runs its arguments, so it is looked through."""
    words = words_of(service.get("entrypoint")) + words_of(service.get("command"))
    if words[:1] == ["tuner-entrypoint"]:
        words = words[1:]
    if words[:2] in (["sh", "-c"], ["bash", "-c"]):
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        return [[expand_shell(w, env) for w in argv]
                for cmd in shell_commands(words[2])
                if (argv := tuner_argv(cmd)) is not None]
    argv = tuner_argv(words)
    return [argv] if argv is not None else []


def dockerfile_stages(path: Path) -> dict[str, str]:
    """Stage name -> its FROM line."""
    stages = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.I)
        if m and m.group(2):
            stages[m.group(2)] = m.group(1)
    return stages


def dockerfile_cmds(path: Path) -> list[list[str]]:
    return [json.loads(m.group(1)) for m in re.finditer(r"^CMD\s+(\[.*\])\s*$", path.read_text(),
                                                         re.M)]


# -- the CLI -------------------------------------------------------------------------

# Typer builds a click command tree (typer >= 0.2x vendors its own click): walk it by
# duck typing, so the test follows whichever click the installed typer uses.
ROOT = typer.main.get_command(app)


def is_group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands") and hasattr(cmd, "get_command")


def check_tuner_command(argv: list[str], env: Mapping[str, str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolve ``tuner ARGV`` through the real command tree: each subcommand must exist,
    each --flag must be one of the final command's options, and the whole line must parse
    (types, required options) with ``env`` as the process environment."""
    cmd: Any = ROOT
    path = ["tuner"]
    rest = list(argv)
    while is_group(cmd):
        assert rest and not rest[0].startswith("-"), f"`{' '.join(path)}` needs a subcommand"
        name = rest.pop(0)
        ctx = cmd.context_class(cmd, info_name=path[-1])
        sub = cmd.get_command(ctx, name)
        assert sub is not None, (f"`{' '.join(path)} {name}`: no such command "
                                 f"(it has {', '.join(sorted(cmd.list_commands(ctx)))})")
        cmd, path = sub, path + [name]
    options = {opt for p in cmd.params if p.param_type_name == "option"
               for opt in (*p.opts, *p.secondary_opts)}
    for word in rest:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in options, (f"`{' '.join(path)}` has no option {flag} "
                                     f"(it has {', '.join(sorted(options))})")
    for var in [v for v in os.environ if v.startswith("TUNER_")]:
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    try:
        cmd.make_context(" ".join(path), list(rest))
    except Exception as err:  # click's UsageError / BadParameter / MissingParameter
        if not hasattr(err, "format_message"):
            raise
        pytest.fail(f"`{' '.join(path)} {' '.join(rest)}`: {err.format_message()}")


def all_tuner_command_lines() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, argv, environment it runs with) for every `tuner` line of the deployment."""
    lines = []
    for name, service in services().items():
        service = interpolate(service, {})
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        if not env.get("TUNER_TOKEN") and env.get("TUNER_TOKEN_FILE"):
            env["TUNER_TOKEN"] = "token-from-file"  # what docker/entrypoint.sh does
        for argv in service_command_lines(service):
            lines.append((f"docker-compose.yml: {name}", argv, env))
    # The images' scripts run inside the server container (TUNER_DATABASE_URL set).
    server_env = {k: str(v) for k, v in
                  (interpolate(services()["server"], {}).get("environment") or {}).items()}
    for script in sorted(DOCKER.glob("*.sh")):
        for cmd in shell_commands(script.read_text()):
            if (argv := tuner_argv(cmd)) is not None:
                lines.append((f"docker/{script.name}", argv, server_env))
    # An image's default command runs with `docker run -e TUNER_SERVER=... -e TUNER_TOKEN=...`.
    run_env = {"TUNER_SERVER": "http://server:8600", "TUNER_TOKEN": "t"}
    for dockerfile in sorted(DOCKER.glob("Dockerfile*")):
        for cmd in dockerfile_cmds(dockerfile):
            if (argv := tuner_argv(cmd)) is not None and argv[:1] != ["--help"]:
                lines.append((f"docker/{dockerfile.name} CMD", argv, run_env))
    for block in code_blocks(readme_fleet_section()):
        for cmd in shell_commands(block):
            if (argv := tuner_argv(cmd)) is not None:
                lines.append(("README Running a fleet", argv, {}))
    return lines


# -- the tests -----------------------------------------------------------------------

def test_services_and_profiles() -> None:
    found = services()
    assert set(found) == SERVICES
    for name, service in found.items():
        assert service.get("profiles") == PROFILES.get(name), name
    assert found["postgres"]["image"].split(":")[0] == "postgres"
    assert found["redis"]["image"].split(":")[0] == "redis"
    for name in ("postgres", "redis", "server"):
        assert found[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_server_migrates_then_serves_on_postgres_and_redis() -> None:
    server = interpolate(services()["server"], {})
    assert server["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                    "redis": {"condition": "service_healthy"}}
    assert "8600:8600" in server["ports"]
    url = server["environment"]["TUNER_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and url.endswith("@postgres:5432/tuner")
    lines = service_command_lines(server)
    assert [argv[:2] for argv in lines] == [["db", "upgrade"], ["serve", "--host"]]
    serve = lines[-1]
    pairs = dict(zip(serve[1::2], serve[2::2]))
    assert pairs["--host"] == "0.0.0.0" and pairs["--port"] == "8600"
    assert pairs["--queue-url"] == "redis://redis:6379/0"


def test_workers_reach_the_server_with_a_worker_token() -> None:
    found = {name: interpolate(s, {}) for name, s in services().items()}
    for name in ("worker-opencl", "worker-cuda", "worker-rocm"):
        worker = found[name]
        (argv,) = service_command_lines(worker)
        assert argv[0] == "worker"
        assert argv[argv.index("--server") + 1] == "http://server:8600"
        assert worker["depends_on"] == {"server": {"condition": "service_healthy"}}
        env = worker["environment"]
        # An explicit token wins; else docker/entrypoint.sh reads the server's shared one.
        assert "TUNER_WORKER_TOKEN" in {r[0] for r in references(services()[name])}
        assert env["TUNER_TOKEN_FILE"] == "/var/lib/tuner/worker.token"
    assert "tuner-worker-token /var/lib/tuner/worker.token" in found["server"]["command"][-1]
    entrypoint = (DOCKER / "entrypoint.sh").read_text()
    assert "TUNER_TOKEN_FILE" in entrypoint and 'exec "$@"' in entrypoint
    devices = {n: found[n]["command"][found[n]["command"].index("--device") + 1]
               for n in ("worker-opencl", "worker-cuda", "worker-rocm")}
    assert devices == {"worker-opencl": "opencl:0", "worker-cuda": "cuda:0",
                       "worker-rocm": "opencl:0"}


def test_gpu_workers_get_their_devices() -> None:
    found = services()
    (gpu,) = found["worker-cuda"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    rocm = found["worker-rocm"]
    assert set(rocm["devices"]) == {"/dev/kfd", "/dev/dri"}
    assert "video" in rocm["group_add"]


COMMAND_LINES = all_tuner_command_lines()


@pytest.mark.parametrize("where,argv,env", COMMAND_LINES,
                         ids=[f"{where}: tuner {' '.join(argv[:2])}"
                              for where, argv, _ in COMMAND_LINES])
def test_every_tuner_command_line_parses(where: str, argv: list[str], env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    check_tuner_command(argv, env, monkeypatch)


def test_the_command_lines_cover_the_deployment() -> None:
    wheres = {where for where, _, _ in COMMAND_LINES}
    assert {f"docker-compose.yml: {s}" for s in ("server", "worker-opencl", "worker-cuda",
                                                 "worker-rocm")} <= wheres
    assert {"docker/worker-token.sh", "README Running a fleet"} <= wheres


def test_variables_are_documented_with_their_defaults() -> None:
    documented = env_example()
    section = readme_fleet_section()
    assert ".env.example" in section
    refs = list(references(compose()))
    assert refs, "docker-compose.yml reads no variables"
    for name, op, arg in refs:
        assert name in documented, f"${{{name}}} is not in .env.example"
        if op in (":-", "-") and documented[name]:
            assert documented[name] == arg, (
                f".env.example shows {name}={documented[name]}, the default is {arg}")
        if op in (":?", "?"):
            assert name in section, f"the required ${{{name}}} is not in README's section"
    unused = set(documented) - {name for name, _, _ in refs}
    assert not unused, f".env.example documents variables compose never reads: {unused}"


def test_dockerfiles_and_their_stages_exist() -> None:
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for name, service in services().items():
        build = service.get("build")
        if build is None:
            continue
        context = REPO / build["context"]
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert build["target"] in dockerfile_stages(dockerfile), (
            f"{name}: {dockerfile.name} has no stage {build['target']}")
        for m in re.finditer(r"^COPY\s+(?!--from)(.+?)\s+(\S+)\s*$", dockerfile.read_text(),
                             re.M):
            for source in m.group(1).split():
                if source.startswith("--"):
                    continue
                assert (context / source).exists(), f"{dockerfile.name}: COPY {source}: missing"
                assert source == "." or not any(
                    source == p or source.startswith(p.rstrip("/") + "/") for p in ignored), (
                    f"{dockerfile.name}: COPY {source}, which .dockerignore leaves out")
    # `pip install .` needs these in the build context.
    for needed in ("pyproject.toml", "README.md", "schemas", "compiler", "workers",
                   "tuner_server", "cli", "migrations", "docker"):
        assert needed not in ignored, f".dockerignore leaves out {needed}"


def test_readme_says_how_to_run_a_fleet() -> None:
    section = readme_fleet_section()
    for needed in ("docker compose up -d", "tuner token create --role worker",
                   "--profile cuda", "--profile rocm", "http://HOST:8600/",
                   "tuner worker --server http://HOST:8600 --token $WT"):
        assert needed in section, f"README's fleet section does not mention {needed!r}"


def compose_binary() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            out = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        # Compose v1 (docker-compose 1.x) predates the top-level `name`; v2 only.
        if out.returncode == 0 and re.match(r"v?2\.", out.stdout.strip()):
            return cmd
    return None


def test_docker_compose_config() -> None:
    cmd = compose_binary()
    if cmd is None:
        pytest.skip("Docker Compose v2 not installed (neither `docker compose` nor "
                    "`docker-compose` answers `version` with 2.x): config not validated")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "POSTGRES_"))}
    out = subprocess.run([*cmd, "-f", str(COMPOSE), "--profile", "cuda", "--profile", "rocm",
                          "config", "-q"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
