"""An HTTP status server: `GET /` answers with the Python stack of every thread, as HTML.

    server = StatusHTTPServer(port)   # port 0: any free port (then read `server.port`)
    server.start()                    # serves from a daemon thread
    ...                               # curl http://<host>:<port>/ shows where each thread is
    server.stop()

The socket is bound in `start()` itself, so a port already in use raises there. As in AXLearn
the server listens on all interfaces by default (`host=""`), for reaching a job's hosts from
outside them; pass `host="127.0.0.1"` to keep it on the machine. The serving thread is a daemon:
it never keeps the process alive when the main thread exits.
"""

from __future__ import annotations

import html
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Optional

from absl import logging

from axlearn.common.trainer_watchdog import thread_stack_traces


def _status_html() -> str:
    """Returns the status page: every thread's stack trace in a `<pre>` block."""
    stacks = thread_stack_traces().split("\n--- ")
    body = "".join(
        f"<pre>{html.escape(s if i == 0 else '--- ' + s)}</pre>" for i, s in enumerate(stacks)
    )
    return f"<html><head><title>python stack traces</title></head><body>{body}</body></html>"


class RequestHandler(BaseHTTPRequestHandler):
    """Answers every GET with the status page."""

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        """Writes the status page."""
        page = _status_html().encode("utf-8")
        self.send_response(200)
        self.send_header("Content-type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        """Logs requests at debug level (http.server writes them to stderr)."""
        logging.debug("status server: " + format, *args)


class StatusHTTPServer:
    """Serves the status page from a daemon thread."""

    def __init__(self, port: int, host: str = ""):
        """Creates the server (nothing is bound until `start`).

        Args:
            port: The TCP port; 0 picks a free one (`port` holds the bound one after `start`).
            host: The address to bind; "" is all interfaces, "127.0.0.1" this machine only.
        """
        self.port = port
        self.host = host
        self.httpd: Optional[HTTPServer] = None
        self.thread: Optional[threading.Thread] = None

    def _start_blocking(self) -> None:
        """Serves until `stop` (the socket is bound by `start`)."""
        logging.info("Serving the status page on port %s.", self.port)
        self.httpd.serve_forever()

    def start(self) -> None:
        """Binds the socket and starts serving in a daemon thread.

        Raises:
            RuntimeError: If the server is already started.
            OSError: If the address cannot be bound (e.g. the port is in use).
        """
        if self.thread is not None:
            raise RuntimeError("StatusHTTPServer is already started.")
        self.httpd = HTTPServer((self.host, self.port), RequestHandler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self._start_blocking, name="StatusHTTPServer", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """Stops serving, closes the socket and joins the thread (no-op if not started)."""
        if self.httpd is None or self.thread is None:
            return
        self.httpd.shutdown()
        self.thread.join()
        self.httpd.server_close()
        self.httpd = None
        self.thread = None
