"""The production image's files, checked without Docker (which cannot run here).

- ``.dockerignore``: read with gitignore's rules (``pathspec``), which agree with Docker's for
  the two forms of pattern the file is allowed: ``/x`` (the context's root) and ``**/x`` (any
  depth); it keeps out what it must and none of what the Dockerfile copies.
- ``Dockerfile``: its order (the dependency layer from the pyproject files alone, then the
  code), a non-root user, the healthcheck, ``signoff serve``; its install lines run as written,
  in a fresh virtualenv, in a copy of the build context made by its own COPY lines.
- The healthcheck asks a real ``signoff serve`` on the port the server was given.
- ``compose.yaml`` against the Compose Specification's JSON schema (tests/docker/README.md).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pathspec
import pytest
import yaml
from packaging.requirements import Requirement

from tests.app.serving import environment, serve
from tests.conftest import free_port
from tests.test_distributions import VERSION, run

REPO = Path(__file__).resolve().parent.parent
EXTRAS = ["slack", "feishu", "email"]


# --- the Dockerfile, read as Docker reads it --------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions in order, ``(KEYWORD, arguments)``, continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    assert isinstance(parsed, list)
    return [str(a) for a in parsed]


def test_the_dependency_layer_is_made_from_the_pyproject_files_alone() -> None:
    steps = instructions()
    installs = [i for i, (kw, args) in enumerate(steps) if kw == "RUN" and "pip install" in args]
    assert len(installs) == 2, steps
    deps, code = installs
    assert "-r " in steps[deps][1]
    assert "scripts/requirements.py" in steps[deps][1]
    copied_before = [src for kw, args in steps[:deps] if kw == "COPY" for src in shlex.split(args)[:-1]]
    assert copied_before == ["pyproject.toml", "hooks/pyproject.toml", "scripts/requirements.py"]
    copied_after = {src for kw, args in steps[deps:code] if kw == "COPY" for src in shlex.split(args)[:-1]}
    assert {"app", "channels", "hooks", "migrations"} <= copied_after
    assert "--no-deps" in steps[code][1]
    assert "pip check" in steps[code][1]


def test_the_image_runs_signoff_serve_as_a_user_of_its_own_with_a_healthcheck() -> None:
    steps = instructions()
    users = [args for kw, args in steps if kw == "USER"]
    assert users == ["signoff"]
    cmd_at = next(i for i, (kw, _) in enumerate(steps) if kw == "CMD")
    user_at = next(i for i, (kw, _) in enumerate(steps) if kw == "USER")
    assert user_at < cmd_at
    assert _exec_form(steps[cmd_at][1]) == ["signoff", "serve"]
    (health,) = [args for kw, args in steps if kw == "HEALTHCHECK"]
    options, _, command = health.partition("CMD ")
    assert _exec_form(command) == ["python", "-m", "signoff.app.healthcheck"]
    assert "8000" not in health  # the port is the server's own (SIGNOFF_PORT)
    assert "--start-period=" in options


# --- .dockerignore ----------------------------------------------------------------------------


def _ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _ignored() -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines(_ignore_patterns())


def test_every_ignore_pattern_means_the_same_to_docker_and_to_gitignore() -> None:
    # Docker anchors every pattern at the context's root and reads ``**`` as any number of
    # folders; gitignore matches a slash-less pattern at any depth. Written as /x or **/x,
    # a pattern means one thing to both.
    for pattern in _ignore_patterns():
        assert not pattern.startswith("!"), pattern
        assert pattern.startswith(("/", "**/")), pattern


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".venv/lib/python3.11/site-packages/fastapi/__init__.py",
        "signoff.db",
        "signoff.db-wal",
        "signoff.db-shm",
        "signoff.db.lock",
        "data/other.db",
        ".signoff-admin-token",
        ".env",
        "app/__pycache__/db.cpython-311.pyc",
        "tests/app/__pycache__/test_cli.cpython-311-pytest-8.3.4.pyc",
        ".pytest_cache/v/cache/lastfailed",
        ".mypy_cache/3.11/app.json",
        ".ruff_cache/0.8.0/123",
        ".hypothesis/examples/abc",
        "dist/signoff-0.1.0-py3-none-any.whl",
        "build/lib/signoff/app/db.py",
        "signoff.egg-info/PKG-INFO",
        "hooks/signoff_hooks.egg-info/PKG-INFO",
        "tests/conftest.py",
    ],
)
def test_the_build_context_leaves_out(path: str) -> None:
    assert _ignored().match_file(path), path


def _tracked() -> list[str]:
    return run("git", "ls-files", cwd=REPO).split()


def _copied() -> list[str]:
    """What the Dockerfile's COPY lines copy from the context (each line's sources)."""
    return [source for kw, args in instructions() if kw == "COPY" for source in shlex.split(args)[:-1]]


def test_the_build_context_keeps_everything_the_dockerfile_copies() -> None:
    sources = _copied()
    copied = [f for f in _tracked() if any(f == s or f.startswith(f"{s}/") for s in sources)]
    assert len(copied) > 100
    kept_out = [f for f in copied if _ignored().match_file(f)]
    assert kept_out == []
    for source in sources:
        assert (REPO / source).exists(), source


def context(root: Path, into: Path) -> Path:
    """A copy of the build context of the checkout at ``root``: its files, less those the
    ignore file keeps out (the untracked ones too: a developer's .venv, signoff.db)."""
    ignored = _ignored()
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not ignored.match_file(f"{(rel / d).as_posix()}/")]
        for name in files:
            path = (rel / name).as_posix()
            if not ignored.match_file(path):
                (into / rel).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, into / rel / name)
    return into


def test_the_build_context_is_small_and_holds_no_secret(tmp_path: Path) -> None:
    copy = context(REPO, tmp_path / "context")
    files = [p for p in copy.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert size < 20 * 1024 * 1024, f"{size / 1024 / 1024:.1f} MiB"
    names = {p.relative_to(copy).as_posix() for p in files}
    assert not {n for n in names if n.startswith((".venv/", ".git/")) or n.endswith(".db")}
    assert ".signoff-admin-token" not in names
    assert {"pyproject.toml", "hooks/pyproject.toml", "app/main.py", "Dockerfile"} <= names


# --- the install lines ------------------------------------------------------------------------


def _script_requirements() -> list[str]:
    return run(sys.executable, REPO / "scripts" / "requirements.py", *EXTRAS).splitlines()


def _canonical(requirement: str) -> str:
    parsed = Requirement(requirement)
    parsed.marker = None
    extras = ",".join(sorted(parsed.extras))
    return f"{parsed.name.lower().replace('_', '-')}{f'[{extras}]' if extras else ''}{parsed.specifier}"


def _requires_dist(distribution: str, extras: list[str]) -> set[str]:
    """What ``distribution`` as installed here requires with ``extras`` (its metadata's
    Requires-Dist, which its wheel carries too)."""
    out = set()
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in extras):
            out.add(_canonical(str(requirement)))
    return out


def test_the_dependency_layer_installs_what_the_distributions_require() -> None:
    assert importlib.metadata.version("signoff") == VERSION
    wanted = _requires_dist("signoff", EXTRAS) | _requires_dist("signoff-hooks", [])
    assert {_canonical(r) for r in _script_requirements()} == wanted - {f"signoff-hooks=={VERSION}"}


@pytest.mark.e2e
def test_the_dockerfiles_install_lines_work_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The Dockerfile's WORKDIR, COPY and pip RUN lines, run as written in a copy of the build
    context, with a fresh virtualenv's ``python`` and ``pip`` first on PATH. (Its ENV lines are
    not applied: PIP_NO_CACHE_DIR would download every package again.)"""
    build = context(REPO, tmp_path / "context")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    root = tmp_path / "image"
    workdir = root
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    ran = 0
    for keyword, args in instructions():
        if keyword == "USER":
            break
        if keyword == "WORKDIR":
            workdir = root / args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, target = shlex.split(args)
            for source in sources:
                destination = workdir / target
                if (build / source).is_dir():
                    shutil.copytree(build / source, destination, dirs_exist_ok=True)
                    continue
                if target.endswith("/"):
                    destination.mkdir(parents=True, exist_ok=True)
                    destination = destination / Path(source).name
                shutil.copy2(build / source, destination)
        elif keyword == "RUN" and "pip" in args:
            # /tmp in the command is the image's own: here, a folder of the test's.
            command = args.replace("/tmp/", f"{tmp_path}/")
            done = subprocess.run(
                ["sh", "-ec", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
            )
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            ran += 1
    assert ran == 2
    signoff = venv / "bin" / "signoff"
    assert run(signoff, "--version", env=env) == f"signoff {VERSION}\n"
    # Installed, not linked to the copy: the server's migrations and console ship in the venv.
    shutil.rmtree(root)
    probe = "import signoff.app.db as d, signoff.app.healthcheck; print(d.head_revision())"
    assert run(venv / "bin" / "python", "-c", probe, env=env).strip()


# --- the healthcheck --------------------------------------------------------------------------


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signoff.app.healthcheck"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_healthcheck_asks_the_port_the_server_was_given(tmp_path: Path) -> None:
    port = free_port()
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}", SIGNOFF_PORT=str(port))
    with serve(env, tmp_path / "serve.log", port=port):
        healthy = _healthcheck({**env, "SIGNOFF_HOST": "0.0.0.0"})
        assert (healthy.returncode, healthy.stderr) == (0, "")
        elsewhere = free_port()
        unhealthy = _healthcheck({**env, "SIGNOFF_HOST": "0.0.0.0", "SIGNOFF_PORT": str(elsewhere)})
    assert unhealthy.returncode == 1
    assert unhealthy.stderr.startswith(f"unhealthy: http://127.0.0.1:{elsewhere}/healthz: ")
    assert unhealthy.stderr.count("\n") == 1


# --- compose.yaml -----------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_compose_yaml_follows_the_compose_specification() -> None:
    schema = json.loads((REPO / "tests" / "docker" / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(_compose()), key=lambda e: list(e.path))
    assert [f"{list(e.path)}: {e.message}" for e in errors] == []


def test_the_schema_refuses_what_compose_refuses() -> None:
    # The check has teeth: a misspelt key and a wrong type are errors.
    schema = json.loads((REPO / "tests" / "docker" / "compose-spec.json").read_text(encoding="utf-8"))
    broken = _compose()
    broken["services"]["signoff-a"]["helthcheck"] = {"test": ["CMD", "true"]}
    broken["services"]["postgres"]["ports"] = "5432"
    assert len(list(jsonschema.Draft7Validator(schema).iter_errors(broken))) >= 2


def test_compose_runs_postgres_and_two_replicas_with_their_secrets_and_configuration() -> None:
    services = _compose()["services"]
    replicas = {name: s for name, s in services.items() if s.get("command") is None and "build" in s}
    assert sorted(replicas) == ["signoff-a", "signoff-b"]
    host_ports = set()
    for service in replicas.values():
        env = service["environment"]
        for name in ("SIGNOFF_ADMIN_TOKEN", "SIGNOFF_SESSION_SECRET"):
            assert env[name] == f"${{{name}:?set {name} in .env}}", name  # required, from .env
        assert env["SIGNOFF_DATABASE_URL"].startswith("postgresql://signoff:")
        assert "@postgres:5432/signoff" in env["SIGNOFF_DATABASE_URL"]
        (mount,) = service["volumes"]
        assert mount.split(":")[-2:] == [env["SIGNOFF_CONFIG"], "ro"]
        assert service["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
        (port,) = service["ports"]
        host_ports.add(port.rsplit(":", 1)[0])
    assert len(host_ports) == 2
    assert services["migrate"]["command"] == ["signoff", "db", "upgrade"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["postgres"]["image"].startswith("postgres:")
    assert "healthcheck" in services["postgres"]
