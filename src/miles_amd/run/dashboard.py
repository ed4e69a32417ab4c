"""HTTP to a Ray dashboard: every request bounded, every failure one redacted line, 401/403 named.

``docs/ray-head-and-secrets.md`` ("How the tool talks to a dashboard").
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from miles_amd.redact import redact

DEFAULT_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 5.0
TIMEOUT_VAR = "MILES_AMD_RAY_HTTP_TIMEOUT"
T = TypeVar("T")
TOKEN_HELP = "set RAY_AUTH_TOKEN_PATH to a file holding the cluster's token"


class DashboardError(RuntimeError):
    """The dashboard could not be reached or answered something unusable."""


class DashboardAuthError(DashboardError):
    def __init__(self, address: str, status: int) -> None:
        why = "the token sent is wrong" if status == 403 else "no token sent"
        super().__init__(
            f"Ray at {address} requires token authentication (HTTP {status}: {why}); " + TOKEN_HELP
        )
        self.address, self.status = address, status


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token_headers(token_path: str | None) -> dict[str, str]:
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
    address: str, path: str, headers: Mapping[str, str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Any:
    """``GET address + path``: the decoded JSON answer, complete within twice ``timeout_s``."""
    url, basic = _credentials_apart(address.rstrip("/") + path)
    request = urllib.request.Request(url, headers={**basic, **headers})

    def fetch() -> Any:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    try:
        return within(2 * timeout_s, fetch, url)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise DashboardAuthError(address, exc.code) from None
        raise DashboardError(redact(f"{url}: HTTP {exc.code} {exc.reason}")) from None
    except (OSError, ValueError) as exc:
        raise DashboardError(f"{url}: {one_line(exc)}") from None


def _credentials_apart(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without ``user:password@``, and the Basic header they make (as ``requests``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, {}
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    netloc = parts.netloc.rpartition("@")[2]
    header = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {"Authorization": header}


def read_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    given = (os.environ if environ is None else environ).get(TIMEOUT_VAR, "").strip()
    if not given:
        return DEFAULT_TIMEOUT_S
    with contextlib.suppress(ValueError):
        value = float(given)
        if math.isfinite(value) and value > 0:
            return value
    raise DashboardError(f"{TIMEOUT_VAR}={given!r}: must be a number of seconds > 0, e.g. 15")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as one short line, redacted before it is cut."""
    text = redact(" ".join(str(exc).split())) or type(exc).__name__
    text = text[:limit] + "..." if len(text) > limit else text
    return f"{type(exc).__name__}: {text}"


def within(seconds: float, call: Callable[[], T], what: str = "the request") -> T:
    """``call()``'s value or exception if it ends within ``seconds``, else ``TimeoutError``."""
    done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            done.put((True, call()))
        except BaseException as exc:  # handed to the caller
            done.put((False, exc))

    threading.Thread(target=run, name="ray-dashboard-call", daemon=True).start()
    try:
        ok, value = done.get(timeout=max(seconds, 0.01))
    except queue.Empty:
        raise TimeoutError(f"{what} had no complete answer within {seconds:.3g} s") from None
    if not ok:
        raise value
    return value


class JobsClient:
    """Ray's ``JobSubmissionClient`` with each call bounded and each failure a
    :class:`DashboardError`; ``deadline`` (monotonic), when set, caps every read timeout."""

    def __init__(self, client: Any, address: str, read_timeout: float) -> None:
        self.client, self.address, self.read_timeout = client, address, read_timeout
        self.deadline: float | None = None

    def timeout(self) -> tuple[float, float]:
        read = self.read_timeout
        if self.deadline is not None:
            read = min(read, self.deadline - time.monotonic())
            if read <= 0:
                raise DashboardError(
                    f"{self.address}: the run's time (--timeout and the stop's grace) is up"
                )
        return min(CONNECT_TIMEOUT_S, read), read

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The client's method ``name``, bounded (a log tail is an async stream: as it is)."""
        method = getattr(self.client, name)
        if name == "tail_job_logs":
            return method

        def bounded(*args: Any, **kwargs: Any) -> Any:
            what = " ".join((name, *map(str, args)))
            connect, read = self.timeout()
            try:
                return within(connect + read + 1.0, lambda: method(*args, **kwargs), what)
            except DashboardError:
                raise
            except Exception as exc:
                raise DashboardError(f"{self.address}: {what}: {one_line(exc)}") from None

        return bounded


def jobs_client(address: str, headers: Mapping[str, str]) -> JobsClient:
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def __init__(self, bound: JobsClient, *args: Any, **kwargs: Any) -> None:
            self.bound = bound
            super().__init__(*args, **kwargs)

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self.bound.timeout())
            return super()._do_request(method, endpoint, **kwargs)

    bound = JobsClient(None, address, read_timeout_s())
    connect, read = bound.timeout()
    try:  # the client asks for the version twice
        bound.client = within(
            2 * (connect + read) + 1.0,
            lambda: TimedClient(bound, address, headers=dict(headers) or None),
            "the version check",
        )
        return bound
    except AuthenticationError as exc:
        status = 403 if exc.message.startswith("Authentication failed") else 401
        raise DashboardAuthError(address, status) from exc
    except Exception as exc:  # Ray's text repeats the address: keep what it adds
        said = one_line(exc).replace(f" at address: {address}", "").rstrip(".")
        raise DashboardError(
            f"no Ray Jobs API at {address} ({said}); fix: start the cluster's head, or point "
            "--ray-address / RAY_ADDRESS at its dashboard (http://HEAD:8265)"
        ) from exc
