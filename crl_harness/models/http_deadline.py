"""A deadline for HTTP requests that the server cannot extend.

Holds ``Deadline`` and ``bound_by_deadline``. The HTTP clients under the ``openai`` package (httpx,
or httpx2 in its later releases) time each socket operation on its own: a server that sends one
byte of JSON whitespace before each read times out keeps a request alive for as long as it
trickles. ``bound_by_deadline`` wraps the network backend of such a client's connection pools, so
that every connect, read and write of a thread waits at most until that thread's ``Deadline``,
and fails with the HTTP stack's own timeout error past it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from crl_harness.models.base import BackendUnavailableError

__all__ = ["Deadline", "bound_by_deadline"]


class Deadline:
    """The moment, per thread, by which a request must be over (none outside ``until``).

    Example:
        >>> deadline = Deadline()
        >>> deadline.left() is None
        True
        >>> with deadline.until(time.monotonic() + 5):
        ...     0 < deadline.left() <= 5
        True
    """

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def until(self, moment: float) -> Iterator[None]:
        """Bound this thread's network operations by ``moment`` (``time.monotonic``) inside."""
        self._local.moment = moment
        try:
            yield
        finally:
            self._local.moment = None

    def left(self) -> float | None:
        """Seconds left to this thread's deadline (None: it has none)."""
        moment = getattr(self._local, "moment", None)
        return None if moment is None else moment - time.monotonic()

    def clip(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout`` cut to the time left, or ``error`` when none is left."""
        left = self.left()
        if left is None:
            return timeout
        if left <= 0:
            raise error("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """A connection of the HTTP stack whose reads and writes end by the deadline."""

    def __init__(self, stream: Any, deadline: Deadline, errors: Any) -> None:
        self._stream, self._deadline, self._errors = stream, deadline, errors

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.clip(timeout, self._errors.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.clip(timeout, self._errors.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> _DeadlineStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._deadline.clip(timeout, self._errors.ConnectTimeout))
        return _DeadlineStream(stream, self._deadline, self._errors)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend:
    """The HTTP stack's network backend, its connections bound by the deadline."""

    def __init__(self, backend: Any, deadline: Deadline) -> None:
        self._backend, self._deadline = backend, deadline
        # httpcore or httpcore2: the timeout errors the rest of that stack maps and retries
        self._errors = sys.modules[type(backend).__module__.partition(".")[0]]

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    **options: Any) -> _DeadlineStream:
        timeout = self._deadline.clip(timeout, self._errors.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, **options),
                               self._deadline, self._errors)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            **options: Any) -> _DeadlineStream:
        timeout = self._deadline.clip(timeout, self._errors.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, **options),
                               self._deadline, self._errors)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def bound_by_deadline(http_client: Any, deadline: Deadline) -> None:
    """Make every connection of ``http_client`` (an ``httpx.Client``, or httpx2's) end its
    operations by ``deadline``, proxies' included.

    Neither httpx nor httpx2 takes a network backend as an option, so their transports' pools
    are reached through the attributes both have had since their first releases; a version
    without them is refused at once rather than left without the bound.
    """
    transports = [http_client._transport, *http_client._mounts.values()]
    pools = [getattr(transport, "_pool", None) for transport in transports]
    pools = [pool for pool in pools if hasattr(pool, "_network_backend")]
    if not pools:
        raise BackendUnavailableError(
            f"The openai backend cannot bound its requests' time with this HTTP client "
            f"({type(http_client).__module__}); install a tested one: pip install 'openai<4'.")
    for pool in pools:
        pool._network_backend = _DeadlineBackend(pool._network_backend, deadline)
