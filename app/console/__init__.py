"""The operator console: server-rendered pages under ``/ui`` (Jinja2 and a little htmx).

:mod:`.mount` serves it from the app; the package itself imports nothing, so the command
line's ``signoff operators hash-password`` loads :mod:`.passwords` without the web stack.
"""
