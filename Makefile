# Two commands: `make run` (the server on SQLite with the example config) and
# `make test` (everything CI runs). Both install what they need into .venv.
# `make dist` builds the two distributions, signoff-hooks (what an agent installs) and
# signoff (the server), as sdists and wheels into dist/.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DIST ?= dist
SUM := $(shell cat pyproject.toml hooks/pyproject.toml | cksum | cut -d' ' -f1)
RUN_STAMP := $(VENV)/.installed-run-$(SUM)
STAMP := $(VENV)/.installed-dev-$(SUM)

# Python keeps its bytecode caches even where the environment says not to: pytest's rewritten
# test modules and every `signoff`, hook and proxy process the tests start are compiled once,
# not every time (collection alone: 14 s a worker without them, 8 s with).
unexport PYTHONDONTWRITEBYTECODE

export SIGNOFF_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/signoff_test
MIGRATIONS_PG_URL := postgresql://postgres@127.0.0.1:5432/signoff_migrations_check
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The tests' temporary files (their SQLite databases, virtualenvs, logs) go to memory where
# /dev/shm is: a sync there costs nothing, so a test never waits seconds on a disk another
# test is filling. The syncs are still made, and the durability test still counts them.
TEST_TMPDIR := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo "$${TMPDIR:-/tmp}")

.PHONY: install install-run run test test-fast coverage lint typecheck migrations-check pytest postgres chromium strace pgbouncer bench dist clean

install: $(STAMP)

# What running needs: the server and its channels' extras (`make run`).
install-run: $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml hooks/pyproject.toml
	@if [ ! -f $(STAMP) ]; then \
		echo "==> installing Signoff into $(VENV)"; \
		test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
		$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1" && \
		$(BIN)/python -m pip install --quiet -e ./hooks -e ".[slack,feishu,email,teams]"; \
	fi
	@rm -f $(VENV)/.installed-run-* && touch $@

# Everything: the server and the development tools (`make test`).
$(STAMP): pyproject.toml hooks/pyproject.toml
	@echo "==> installing Signoff and its development tools into $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	@$(BIN)/python -m pip install --quiet -e ./hooks -e ".[slack,feishu,email,teams]" --group dev
	@rm -f $(VENV)/.installed-* && touch $@ $(RUN_STAMP)

# The admin token is the operator API's password: readable by its owner alone (0600).
run: install-run
	@umask 077 && { test -s .signoff-admin-token || $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(24))" > .signoff-admin-token; } && chmod 600 .signoff-admin-token
	@echo "==> Signoff on http://$${SIGNOFF_HOST:-127.0.0.1}:$${SIGNOFF_PORT:-8000} ($$(test -n "$$SIGNOFF_DATABASE_URL" && echo 'database: $$SIGNOFF_DATABASE_URL' || echo 'SQLite: ./signoff.db'), config: $${SIGNOFF_CONFIG:-examples/signoff.yaml})"
	@echo "    operator API token: $$(cat .signoff-admin-token)   (export SIGNOFF_ADMIN_TOKEN=$$(cat .signoff-admin-token))"
	@SIGNOFF_CONFIG=$${SIGNOFF_CONFIG:-examples/signoff.yaml} SIGNOFF_ADMIN_TOKEN=$$(cat .signoff-admin-token) \
		SIGNOFF_LOG_FORMAT=$${SIGNOFF_LOG_FORMAT:-text} \
		$(BIN)/signoff serve

test: install postgres chromium strace pgbouncer lint typecheck migrations-check pytest

lint: install
	@echo "==> ruff"
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .

typecheck: install
	@echo "==> mypy --strict"
	@# mypy cannot follow the editable install's import hook; it reads the same folders
	@# through a tree of links named as installed (signoff/app -> app, ...).
	@mkdir -p $(VENV)/typecheck/signoff
	@for d in app channels hooks migrations; do ln -sfn "$(CURDIR)/$$d" $(VENV)/typecheck/signoff/$$d; done
	@$(BIN)/mypy

postgres:
	@bash scripts/ensure-postgres.sh

migrations-check: install
	@echo "==> migrations: upgrade and check on SQLite and PostgreSQL"
	@rm -f /tmp/signoff-migrations-check.db
	@SIGNOFF_DATABASE_URL=sqlite:////tmp/signoff-migrations-check.db $(BIN)/alembic upgrade head
	@SIGNOFF_DATABASE_URL=sqlite:////tmp/signoff-migrations-check.db $(BIN)/alembic check
	@psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS signoff_migrations_check WITH (FORCE)"
	@psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE signoff_migrations_check"
	@SIGNOFF_DATABASE_URL=$(MIGRATIONS_PG_URL) $(BIN)/alembic upgrade head
	@SIGNOFF_DATABASE_URL=$(MIGRATIONS_PG_URL) $(BIN)/alembic check

# The console's browser tests drive Debian's chromium (Playwright never downloads a browser here).
chromium:
	@test -x /usr/bin/chromium || { \
		echo "==> installing Debian's chromium for the console's browser tests"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
			chromium fonts-dejavu-core >/dev/null; }

# The durability test counts a real server's syncs with strace.
strace:
	@test -x /usr/bin/strace || { \
		echo "==> installing strace for the durability test"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq strace >/dev/null; }

# The PgBouncer tests start Debian's pgbouncer in transaction pooling (tests/app/test_pgbouncer.py).
pgbouncer:
	@test -x /usr/sbin/pgbouncer || { \
		echo "==> installing Debian's pgbouncer for the PgBouncer tests"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq pgbouncer >/dev/null; }

pytest: install chromium strace pgbouncer
	@VENV=$(VENV) bash scripts/ensure-claude-code.sh
	@echo "==> pytest (SQLite and PostgreSQL), one worker per core"
	@TMPDIR=$(TEST_TMPDIR) $(BIN)/pytest -n auto --dist loadfile --no-loadscope-reorder --durations=25

# The inner loop: SQLite only, no browser, no end-to-end installs or CLI runs (the markers
# postgres, browser and e2e: tests/README.md). Three workers on two cores: a third of the
# inner loop's time is spent waiting on processes and timers, which a third worker fills.
test-fast: install
	@echo "==> pytest: not postgres, browser or e2e, three workers"
	@TMPDIR=$(TEST_TMPDIR) $(BIN)/pytest -n 3 --dist loadfile --no-loadscope-reorder -q -m "not postgres and not browser and not e2e"

# Line and branch coverage of app, channels and hooks over the whole suite (tests/README.md).
coverage: install postgres chromium strace pgbouncer
	@VENV=$(VENV) bash scripts/ensure-claude-code.sh
	@TMPDIR=$(TEST_TMPDIR) $(BIN)/pytest -n auto --dist loadfile --no-loadscope-reorder -q --cov --cov-report=term

bench: install postgres
	@$(BIN)/python -m bench

# tests/test_distributions.py builds with this target (and installs what it builds).
dist: install
	@echo "==> building signoff-hooks and signoff into $(DIST)/"
	@$(BIN)/python -m build --quiet --outdir $(DIST) hooks
	@$(BIN)/python -m build --quiet --outdir $(DIST) .
	@ls $(DIST)/*.whl

clean:
	rm -rf $(VENV) $(DIST) .pytest_cache .mypy_cache .ruff_cache signoff.db*
