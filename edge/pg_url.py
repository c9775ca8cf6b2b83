"""The one rule for a PostgreSQL URL in the edge's config: it names where, never the password."""

from __future__ import annotations

from urllib.parse import urlsplit


def postgres_url_problem(url: str, setting: str) -> str | None:
    """Why ``url`` cannot be used for ``setting`` (one line naming it), or None. The password comes from
    PGPASSWORD or a PGPASSFILE (a Kubernetes Secret, a file only the service reads), never config text."""
    if not url:
        return f"{setting}: required with the postgres backend (postgresql://USER@HOST:PORT/DB)"
    try:
        parts = urlsplit(url)
        password = parts.password
        parts.port  # noqa: B018  (a port that is not a number raises here, not in the driver)
    except ValueError as exc:  # a port that is not a number, a bracket left open
        return f"{setting}: not a URL: {exc}"
    if parts.scheme not in ("postgres", "postgresql"):
        return f"{setting}: expected postgresql://USER@HOST:PORT/DB, not {url!r}"
    if password:
        return (
            f"{setting}: holds a password; give it in PGPASSWORD or a PGPASSFILE instead (config text "
            "and command lines are not secret)"
        )
    return None
