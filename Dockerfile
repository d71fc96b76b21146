FROM python:3.11-slim

WORKDIR /srv/signoff
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY channels ./channels
COPY hooks ./hooks
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-cache-dir ./hooks ".[slack,feishu,email,teams]" \
    && useradd --system --home /var/lib/signoff signoff \
    && mkdir -p /var/lib/signoff && chown signoff /var/lib/signoff

USER signoff
WORKDIR /var/lib/signoff
ENV SIGNOFF_HOST=0.0.0.0 \
    SIGNOFF_PORT=8000 \
    SIGNOFF_DATABASE_URL=sqlite:////var/lib/signoff/signoff.db
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["signoff", "serve"]
