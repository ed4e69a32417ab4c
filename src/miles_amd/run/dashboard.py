"""HTTP to a Ray dashboard: its URL, the token header, timeouts, and 401/403 named.

Decides how this tool talks to a dashboard (the Jobs API address, e.g.
``http://127.0.0.1:8265``) and nothing about what it asks: the head's readiness
(``ray_head``), the node list (``cluster``), the test cluster's nodes
(``tests/support/two_node.py``) and the Jobs SDK client (``driver``, ``variants_run``) all go
through here.

- The token travels as ``Authorization: Bearer <token>`` (:func:`auth_headers`), the header
  Ray's dashboard middleware checks (``http_token_authentication.py``): without it the
  dashboard answers 401, with a wrong one 403; both raise :class:`DashboardAuthError`, whose
  message says which and what to set. :func:`token_headers` reads a token file
  (``RAY_AUTH_TOKEN_PATH``); without one Ray's SDK applies its own rule in this process
  (``RAY_AUTH_MODE=token`` sends ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``).
- Every request has a timeout (:data:`DEFAULT_TIMEOUT_S` unless the caller gives one); any
  other failure (refused, timed out, not JSON, another HTTP status) is a
  :class:`DashboardError` naming the URL.
- :func:`jobs_client` builds Ray's ``JobSubmissionClient`` with the headers; Ray's
  ``AuthenticationError`` becomes :class:`DashboardAuthError` too (ray imported only there).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 15.0
TOKEN_HELP = "set RAY_AUTH_TOKEN_PATH to a file holding the cluster's token"


class DashboardError(RuntimeError):
    """The dashboard could not be reached or answered something unusable."""


class DashboardAuthError(DashboardError):
    """HTTP 401 (no token sent) or 403 (the token sent is wrong)."""

    def __init__(self, address: str, status: int) -> None:
        why = "the token sent is wrong" if status == 403 else "no token sent"
        super().__init__(
            f"Ray at {address} requires token authentication (HTTP {status}: {why}); " + TOKEN_HELP
        )
        self.address, self.status = address, status


def auth_headers(token: str) -> dict[str, str]:
    """The HTTP header Ray's dashboard checks (``Authorization: Bearer <token>``)."""
    return {"Authorization": f"Bearer {token}"}


def token_headers(token_path: str | None) -> dict[str, str]:
    """:func:`auth_headers` of the token in ``token_path`` (``RAY_AUTH_TOKEN_PATH``); no
    headers without a path. ``DashboardError`` for an unreadable or empty file."""
    if token_path is None:
        return {}
    try:
        token = Path(token_path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DashboardError(
            f"RAY_AUTH_TOKEN_PATH={token_path}: cannot read the token ({exc})"
        ) from None
    if not token:
        raise DashboardError(f"RAY_AUTH_TOKEN_PATH={token_path}: the file is empty")
    return auth_headers(token)


def get_json(
    address: str,
    path: str,
    headers: Mapping[str, str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """``GET address + path`` with ``headers``; the decoded JSON answer."""
    url = address.rstrip("/") + path
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise DashboardAuthError(address, exc.code) from None
        raise DashboardError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise DashboardError(f"{url}: {exc}") from None


def jobs_client(address: str, headers: Mapping[str, str]) -> Any:
    """Ray's Jobs API client for ``address``, sending ``headers`` on every request."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=dict(headers) or None)
    except AuthenticationError as exc:
        status = 403 if exc.message.startswith("Authentication failed") else 401
        raise DashboardAuthError(address, status) from exc
    except Exception as exc:  # Ray's text repeats the address: keep what it adds
        said = " ".join(str(exc).split()).replace(f" at address: {address}", "").rstrip(".")
        raise DashboardError(
            f"no Ray Jobs API at {address} ({said}); fix: start the cluster's head, or point "
            "--ray-address / RAY_ADDRESS at its dashboard (http://HEAD:8265)"
        ) from exc
