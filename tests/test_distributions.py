"""The two distributions as a user installs them: built from this repository by ``make dist``
(sdist, then the wheel from the sdist), each installed into a fresh virtualenv, looked at from
the outside.

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
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from signoff.hooks._install import install_hint

pytestmark = pytest.mark.e2e

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
    """Both distributions, built once per run by ``make dist`` with this environment's Python
    (``-o install``: this environment is installed already)."""
    out = tmp_path_factory.mktemp("dist")
    run("make", "-s", "-o", "install", "dist", f"DIST={out}", f"BIN={Path(sys.executable).parent}", cwd=REPO)
    return out


def pip(python: Path, *args: str | Path) -> str:
    """This environment's pip, acting on the virtualenv of ``python``."""
    return run(sys.executable, "-m", "pip", "--python", python, *args)


class Virtualenvs:
    """One fresh virtualenv per requirement (a distribution with its extras), shared for the rest
    of the run. Those the run's tests will ask for are made side by side as soon as the first is
    asked for (each is mostly waiting on pip), so the slowest sets the pace, not their sum."""

    def __init__(self, dist: Path, root: Path, wanted: list[str]) -> None:
        self.dist = dist
        self.root = root
        self.wanted = wanted
        self.made: dict[str, Future[Path]] = {}
        self.pool = ThreadPoolExecutor(max_workers=3)

    def _make(self, requirement: str, path: Path) -> Path:
        run(sys.executable, "-m", "venv", "--without-pip", path)
        python = path / "bin" / "python"
        pip(python, "install", "--quiet", "--no-compile", "--find-links", self.dist, requirement)
        return python

    def _start(self, requirement: str) -> None:
        if requirement not in self.made:
            path = self.root / f"venv-{len(self.made)}"
            self.made[requirement] = self.pool.submit(self._make, requirement, path)

    def __call__(self, requirement: str) -> Path:
        """The ``python`` of the virtualenv with ``requirement`` installed from the built wheels."""
        self._start(requirement)
        for other in self.wanted:
            self._start(other)
        return self.made[requirement].result()


HOOKS_ALONE = f"signoff-hooks=={VERSION}"
SERVER = f"signoff=={VERSION}"


def _wanted(items: list[pytest.Item]) -> list[str]:
    """The requirements the collected tests of this module will ask for."""
    wanted: list[str] = []
    for item in items:
        if getattr(item, "module", None) is not sys.modules[__name__]:
            continue
        names = getattr(item, "fixturenames", ())
        params = getattr(getattr(item, "callspec", None), "params", {})
        for needed, requirement in (
            ("agent" in names, HOOKS_ALONE),
            ("server_bin" in names, SERVER),
            ("extra" in params, f"signoff-hooks[{params.get('extra')}]=={VERSION}"),
        ):
            if needed and requirement not in wanted:
                wanted.append(requirement)
    return wanted


@pytest.fixture(scope="session")
def virtualenv(
    dist: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Virtualenvs]:
    made = Virtualenvs(dist, tmp_path_factory.mktemp("venvs"), _wanted(request.session.items))
    yield made
    made.pool.shutdown(cancel_futures=True)


def installed(python: Path) -> set[str]:
    listed = json.loads(pip(python, "list", "--format", "json"))
    return {p["name"].lower().replace("_", "-") for p in listed} - {"pip", "setuptools"}


def test_make_dist_builds_both_distributions(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        f"signoff-{VERSION}-py3-none-any.whl",
        f"signoff-{VERSION}.tar.gz",
        f"signoff_hooks-{VERSION}-py3-none-any.whl",
        f"signoff_hooks-{VERSION}.tar.gz",
    ]


def test_both_distributions_are_versioned_together() -> None:
    hooks = tomllib.loads((REPO / "hooks" / "pyproject.toml").read_text())["project"]
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert hooks["version"] == server["version"]
    assert f"signoff-hooks=={hooks['version']}" in server["dependencies"]
    assert hooks["dependencies"] == ["httpx>=0.27"]


@pytest.mark.parametrize(
    ("name", "entry"), [("signoff", set()), ("signoff_hooks", {"_signoff_hooks_entry.py"})]
)
def test_a_wheel_puts_nothing_but_signoff_and_the_scripts_entry_at_the_top_level(
    dist: Path, name: str, entry: set[str]
) -> None:
    (wheel,) = dist.glob(f"{name}-{VERSION}-*.whl")
    tops = {entry.split("/")[0] for entry in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"signoff", f"{name}-{VERSION}.dist-info", *entry}
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
        if source.startswith("hooks/_console/"):  # the console scripts' top-level module
            assert source.removeprefix("hooks/_console/") in shipped, source
            continue
        assert f"signoff/{source}" in shipped, source


BASH_CALL = '{"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {}}'
UNREACHABLE = {"SIGNOFF_URL": "http://127.0.0.1:9", "SIGNOFF_API_KEY": "k", "PATH": "/usr/bin:/bin"}
SHADOWS = {
    "package": ("signoff/__init__.py", "a package named 'signoff' at {project}/signoff"),
    "module": ("signoff.py", "a module named 'signoff' at {project}/signoff.py"),
    "hooks package": (
        "signoff/hooks/__init__.py",
        "a package named 'signoff.hooks' at {project}/signoff/hooks",
    ),
}


def script(
    agent: Path, *args: str, cwd: Path | None = None, stdin: str = "", **env: str
) -> tuple[int, str, str]:
    """One of the installed console scripts, run as a client runs it."""
    done = subprocess.run(
        [str(agent / args[0]), *args[1:]],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env={**UNREACHABLE, **env},
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def agent(virtualenv: Virtualenvs) -> Path:
    """The virtualenv holding signoff-hooks alone, as an agent installs it: its ``bin``."""
    return virtualenv(HOOKS_ALONE).parent


def test_signoff_hooks_alone_needs_only_httpx(agent: Path) -> None:
    python = agent / "python"
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
        assert missing.stderr.strip().endswith(f": {install_hint(extra)}")
    code, _, err = script(agent, "signoff-hook", "claude-code", "--submit-deadline", "0.5", stdin=BASH_CALL)
    assert code == 2
    assert "refused the connection" in err
    code, _, err = script(agent, "signoff-mcp-proxy", "--name", "x", "--", "true")
    assert code == 2
    assert err.strip().endswith(f": {install_hint('mcp')}")


@pytest.mark.parametrize("on_path", ["by PYTHONPATH", "as the current directory"])
@pytest.mark.parametrize("shadow", list(SHADOWS))
def test_a_projects_own_signoff_blocks_the_hook_and_stops_the_proxy(
    agent: Path, tmp_path: Path, shadow: str, on_path: str
) -> None:
    """Both scripts start outside the ``signoff`` namespace: a ``signoff`` of the project's own
    that hides signoff-hooks' exits 2 (the call blocked, the proxy not started) with one line
    saying which file it is and what to do, never exit 1 (which runs the tool)."""
    project = tmp_path / "project"
    shadowing, named = SHADOWS[shadow]
    (project / shadowing).parent.mkdir(parents=True, exist_ok=True)
    (project / shadowing).write_text("")
    if on_path == "by PYTHONPATH":
        cwd, pythonpath, entry = tmp_path, str(project), str(project)
    else:
        cwd, pythonpath, entry = project, ".", f"{project} (the current directory)"
    why = (
        f"{named.format(project=project)} shadows signoff-hooks; "
        f"rename it, or take {entry} off the Python path (PYTHONPATH)"
    )
    hook = script(agent, "signoff-hook", "claude-code", cwd=cwd, stdin=BASH_CALL, PYTHONPATH=pythonpath)
    assert hook == (2, "", f"Blocked by the Signoff approval hook: {why}\n")
    proxy = script(agent, "signoff-mcp-proxy", "--name", "x", "--", "true", cwd=cwd, PYTHONPATH=pythonpath)
    assert proxy == (2, "", f"signoff-mcp-proxy: {why}\n")


@pytest.fixture
def server_bin(virtualenv: Virtualenvs) -> Path:
    """The virtualenv holding the server (and so signoff-hooks), as an operator installs it."""
    return virtualenv(SERVER).parent


@pytest.mark.parametrize("shadow", list(SHADOWS))
def test_the_servers_own_hook_command_blocks_when_a_projects_signoff_shadows_it(
    server_bin: Path, tmp_path: Path, shadow: str
) -> None:
    """``signoff hook claude-code`` is ``signoff-hook claude-code``: a shadowing ``signoff``
    on the Python path exits 2 (the call blocked) with the same one line, never exit 1."""
    project = tmp_path / "project"
    shadowing, named = SHADOWS[shadow]
    (project / shadowing).parent.mkdir(parents=True, exist_ok=True)
    (project / shadowing).write_text("")
    why = (
        f"{named.format(project=project)} shadows signoff-hooks; "
        f"rename it, or take {project} off the Python path (PYTHONPATH)"
    )
    hook = script(
        server_bin, "signoff", "hook", "claude-code", cwd=tmp_path, stdin=BASH_CALL, PYTHONPATH=str(project)
    )
    assert hook == (2, "", f"Blocked by the Signoff approval hook: {why}\n")
    # Unshadowed, the same command is the hook itself: the server unreachable, the call blocked.
    hook_once = ("hook", "claude-code", "--submit-deadline", "0.5")
    code, _, err = script(server_bin, "signoff", *hook_once, cwd=tmp_path, stdin=BASH_CALL)
    assert (code, "refused the connection" in err) == (2, True)
    # Every other command is the server's: shadowed, it cannot start, and says why in one line.
    code, out, err = script(server_bin, "signoff", "--help", cwd=tmp_path, PYTHONPATH=str(project))
    if shadow == "hooks package":
        # Only signoff.hooks is hidden, and the server's help loads nothing of it.
        assert (code, "Usage" in out) == (0, True)
        return
    assert (code, out) == (2, "")
    assert err == (
        f"signoff: {named.format(project=project)} shadows signoff; "
        f"rename it, or take {project} off the Python path (PYTHONPATH)\n"
    )


def test_a_signoff_package_in_the_project_directory_alone_shadows_nothing(
    agent: Path, tmp_path: Path
) -> None:
    """Claude Code runs hooks from the project directory, which is not on a console script's
    path: the hook and the proxy load as they would anywhere else."""
    (tmp_path / "signoff").mkdir()
    (tmp_path / "signoff" / "__init__.py").write_text("raise RuntimeError('the project imported')\n")
    code, _, err = script(
        agent, "signoff-hook", "claude-code", "--submit-deadline", "0.5", cwd=tmp_path, stdin=BASH_CALL
    )
    assert code == 2
    assert "refused the connection" in err
    code, _, err = script(agent, "signoff-mcp-proxy", "--name", "x", "--", "true", cwd=tmp_path)
    assert code == 2
    assert err.strip().endswith(f": {install_hint('mcp')}")


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


def test_the_server_wheel_serves_its_migrations_and_console(server_bin: Path, tmp_path: Path) -> None:
    python = server_bin / "python"
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
