"""The two distributions as a user installs them: built from this repository (sdist, then the
wheel from the sdist), each installed into a fresh virtualenv, looked at from the outside.

The wheels are built once per run, and each set of extras gets one virtualenv per run, shared
by the tests that look at it. The virtualenvs are made without pip of their own and filled by
this environment's pip (``pip --python``), without compiling bytecode: what is installed, and
how it imports and runs, is what a user's ``pip install`` gives."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

# What httpx itself brings; nothing of the server may appear beside it.
HTTPX_AND_ITS_OWN = {"httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio", "typing-extensions"}


def run(*args: str | Path, timeout: float = 600, **kw: object) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both distributions, built once per run."""
    out = tmp_path_factory.mktemp("dist")
    for source in (REPO / "hooks", REPO):
        run(sys.executable, "-m", "build", "--outdir", out, source)
    return out


def pip(python: Path, *args: str | Path) -> str:
    """This environment's pip, acting on the virtualenv of ``python``."""
    return run(sys.executable, "-m", "pip", "--python", python, *args)


class Virtualenvs:
    """One fresh virtualenv per requirement (a distribution with its extras), made the first
    time a test asks for it and shared for the rest of the run."""

    def __init__(self, dist: Path, root: Path) -> None:
        self.dist = dist
        self.root = root
        self.made: dict[str, Path] = {}

    def __call__(self, requirement: str) -> Path:
        """The ``python`` of the virtualenv with ``requirement`` installed from the built wheels."""
        if requirement not in self.made:
            path = self.root / f"venv-{len(self.made)}"
            run(sys.executable, "-m", "venv", "--without-pip", path)
            python = path / "bin" / "python"
            pip(python, "install", "--quiet", "--no-compile", "--find-links", self.dist, requirement)
            self.made[requirement] = python
        return self.made[requirement]


@pytest.fixture(scope="session")
def virtualenv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Virtualenvs:
    return Virtualenvs(dist, tmp_path_factory.mktemp("venvs"))


def installed(python: Path) -> set[str]:
    listed = json.loads(pip(python, "list", "--format", "json"))
    return {p["name"].lower().replace("_", "-") for p in listed} - {"pip", "setuptools"}


def test_both_distributions_are_versioned_together() -> None:
    hooks = tomllib.loads((REPO / "hooks" / "pyproject.toml").read_text())["project"]
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert hooks["version"] == server["version"]
    assert f"signoff-hooks=={hooks['version']}" in server["dependencies"]
    assert hooks["dependencies"] == ["httpx>=0.27"]


@pytest.mark.parametrize("name", ["signoff", "signoff_hooks"])
def test_a_wheel_puts_nothing_but_signoff_at_the_top_level(dist: Path, name: str) -> None:
    (wheel,) = dist.glob(f"{name}-{VERSION}-*.whl")
    tops = {entry.split("/")[0] for entry in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"signoff", f"{name}-{VERSION}.dist-info"}
    # ``signoff`` is a namespace both distributions share: neither owns an __init__.py in it.
    assert "signoff/__init__.py" not in zipfile.ZipFile(wheel).namelist()


def test_the_source_folders_all_ship(dist: Path) -> None:
    (server,) = dist.glob(f"signoff-{VERSION}-*.whl")
    (hooks,) = dist.glob(f"signoff_hooks-{VERSION}-*.whl")
    shipped = set(zipfile.ZipFile(server).namelist()) | set(zipfile.ZipFile(hooks).namelist())
    tracked = run("git", "ls-files", "app", "channels", "hooks", "migrations", cwd=REPO).split()
    assert tracked
    for source in tracked:
        if source in {"hooks/pyproject.toml", "hooks/README.md"}:
            continue
        assert f"signoff/{source}" in shipped, source


def test_signoff_hooks_alone_needs_only_httpx(virtualenv: Virtualenvs) -> None:
    python = virtualenv(f"signoff-hooks=={VERSION}")
    assert installed(python) - HTTPX_AND_ITS_OWN == {"signoff-hooks"}
    run(
        python,
        "-c",
        "import signoff.hooks.client, signoff.hooks.decorator, signoff.hooks.adapters.claude_code\n"
        "from signoff.hooks import HookRegistry, HookContext, Decision\n"
        "import signoff.hooks._plain",
    )
    for module, extra in [
        ("signoff.hooks.adapters.pydantic_ai", "pydantic-ai"),
        ("signoff.hooks.adapters.langchain", "langchain"),
        ("signoff.hooks.adapters.openai_agents", "openai-agents"),
        ("signoff.hooks.mcp_proxy._proxy", "mcp"),
    ]:
        missing = subprocess.run(
            [str(python), "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert missing.returncode == 1
        assert f"pip install 'signoff-hooks[{extra}]'" in missing.stderr
    hook = subprocess.run(
        [str(python.with_name("signoff-hook")), "claude-code", "--submit-deadline", "0.5"],
        input='{"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {}}',
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"SIGNOFF_URL": "http://127.0.0.1:9", "SIGNOFF_API_KEY": "k", "PATH": "/usr/bin:/bin"},
    )
    assert hook.returncode == 2
    assert "refused the connection" in hook.stderr
    proxy = subprocess.run(
        [str(python.with_name("signoff-mcp-proxy")), "--name", "x", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"SIGNOFF_URL": "http://127.0.0.1:9", "SIGNOFF_API_KEY": "k", "PATH": "/usr/bin:/bin"},
    )
    assert proxy.returncode == 2
    assert proxy.stderr.strip().endswith("pip install 'signoff-hooks[mcp]'")


@pytest.mark.parametrize(
    ("extra", "module", "framework"),
    [
        ("pydantic-ai", "signoff.hooks.adapters.pydantic_ai", "pydantic-ai-slim"),
        ("langchain", "signoff.hooks.adapters.langchain", "langchain"),
        ("openai-agents", "signoff.hooks.adapters.openai_agents", "openai-agents"),
        ("mcp", "signoff.hooks.mcp_proxy._proxy", "mcp"),
    ],
)
def test_each_extra_brings_its_runtime(
    virtualenv: Virtualenvs, extra: str, module: str, framework: str
) -> None:
    python = virtualenv(f"signoff-hooks[{extra}]=={VERSION}")
    assert framework in installed(python)
    assert "signoff" not in installed(python)  # the framework's own dependencies, never the server
    run(python, "-c", f"import {module}")
    if extra == "mcp":
        help_text = run(python.with_name("signoff-mcp-proxy"), "--help")
        assert "mcp__NAME__TOOL" in help_text


def test_the_server_wheel_serves_its_migrations_and_console(virtualenv: Virtualenvs, tmp_path: Path) -> None:
    python = virtualenv(f"signoff=={VERSION}")
    assert {"signoff", "signoff-hooks", "fastapi", "sqlalchemy"} <= installed(python)
    signoff = python.with_name("signoff")
    env = {"PATH": "/usr/bin:/bin", "SIGNOFF_DATABASE_URL": f"sqlite:///{tmp_path / 'signoff.db'}"}
    assert "is at head" in run(signoff, "db", "upgrade", env=env, cwd=tmp_path)
    run(
        python,
        "-c",
        "from importlib.resources import files\n"
        "assert files('signoff.app.console').joinpath('templates/queue.html').is_file()\n"
        "assert files('signoff.app.console').joinpath('static/htmx.min.js').is_file()\n"
        "import signoff.app.main",
        cwd=tmp_path,
    )
