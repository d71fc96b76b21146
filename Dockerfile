# The Signoff server: `docker build -t signoff .` (README: "Docker and Compose").
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The user the server runs as (not root), with the home that holds a SQLite database.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/signoff --create-home signoff

WORKDIR /srv/signoff

# The dependency layer: built from the pyproject files alone, so a code change does not
# rebuild it (scripts/requirements.py prints what they require, the extras included).
COPY pyproject.toml ./
COPY hooks/pyproject.toml ./hooks/
COPY scripts/requirements.py ./scripts/
RUN python scripts/requirements.py slack feishu email teams > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The code: Signoff itself, on the dependencies above (pip check: they are all there).
COPY README.md alembic.ini ./
COPY app ./app
COPY channels ./channels
COPY hooks ./hooks
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-deps ./hooks . && pip check

USER signoff
WORKDIR /var/lib/signoff
ENV SIGNOFF_HOST=0.0.0.0 \
    SIGNOFF_PORT=8000 \
    SIGNOFF_DATABASE_URL=sqlite:////var/lib/signoff/signoff.db
VOLUME ["/var/lib/signoff"]
EXPOSE 8000
# /healthz on the port the server was given (SIGNOFF_PORT), not a fixed one.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "signoff.app.healthcheck"]
CMD ["signoff", "serve"]
