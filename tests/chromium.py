"""A small headless-Chromium driver for the site tests, on the standard library.

Chromium speaks the DevTools protocol (CDP) over a pair of pipes when started
with ``--remote-debugging-pipe``: it reads JSON commands, each ended by a NUL
byte, from file descriptor 3 and writes responses and events to descriptor 4.
That is all a test needs to open pages, read console messages and run
JavaScript in them, so no browser-automation package (and no browser download)
is required: only a Chromium binary, e.g. Debian's ``chromium`` package.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Executable names tried, in order, when no path is given.
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """Chromium failed, timed out, or answered a command with an error."""


class BrowserTimeout(BrowserError):
    """Chromium sent nothing before a deadline."""


class Browser:
    """One headless Chromium process, driven over the DevTools pipe."""

    def __init__(
        self,
        executable: str,
        profile_dir: Path,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        argv = [
            executable,
            "--headless",
            "--no-sandbox",  # containers and root: the sandbox cannot start
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            f"--user-data-dir={profile_dir}",
            "--remote-debugging-pipe",
            *extra_args,
            "about:blank",
        ]
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        log = os.open(log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            # posix_spawn puts the pipe ends at the descriptor numbers Chromium
            # expects; every other descriptor of this process is close-on-exec.
            self.pid = os.posix_spawnp(
                executable,
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
                    (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                ],
            )
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
            os.close(log)
        self.log_path = log_path
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._closed = False

    # ------------------------------------------------------------ messages

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserTimeout(
                    f"timed out waiting for Chromium{self._log_hint()}"
                )
            ready, _, _ = select.select([self._from_browser], [], [], remaining)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise BrowserError(
                        "Chromium closed the DevTools pipe (crashed?)"
                        + self._log_hint()
                    )
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _log_hint(self) -> str:
        return f"; its output is in {self.log_path}" if self.log_path else ""

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile
        are kept for :meth:`wait_for` and :meth:`take_events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method}
        message["params"] = params or {}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Wait for an event (kept or new) for which ``predicate`` is true."""
        deadline = time.monotonic() + timeout
        for event in self._events:
            if predicate(event):
                return event
        while True:
            event = self._read_message(deadline)
            if "method" in event:
                self._events.append(event)
                if predicate(event):
                    return event

    def take_events(self, session: str) -> list[dict[str, Any]]:
        """Remove and return the kept events of one session."""
        mine = [e for e in self._events if e.get("sessionId") == session]
        self._events = [e for e in self._events if e.get("sessionId") != session]
        return mine

    def drain(self, seconds: float) -> None:
        """Keep the events that arrive within ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                event = self._read_message(deadline)
                if "method" in event:
                    self._events.append(event)
        except BrowserTimeout:
            pass  # the quiet time is over

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Ask Chromium to quit; kill it (by its own pid) if it does not."""
        if self._closed:
            return
        self._closed = True
        try:
            self.call("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        for _ in range(50):
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self._to_browser)
        os.close(self._from_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Tab:
    """A page target of the browser, attached with its own session."""

    DOMAINS = ("Page", "Runtime", "Log", "Network")

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})
        self.target_id = target["targetId"]
        attached = browser.call(
            "Target.attachToTarget", {"targetId": self.target_id, "flatten": True}
        )
        self.session = attached["sessionId"]
        for domain in self.DOMAINS:
            self.call(f"{domain}.enable")
        browser.take_events(self.session)  # start with a clean event list

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict:
        return self.browser.call(method, params, session=self.session)

    def goto(self, url: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Load ``url``, wait for its load event and a short quiet time, and
        return every event the page produced."""
        self.browser.take_events(self.session)
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"loading {url} failed: {result['errorText']}")
        self.browser.wait_for(
            lambda e: (
                e.get("sessionId") == self.session
                and e["method"] == "Page.loadEventFired"
            ),
            timeout,
        )
        self.browser.drain(0.5)  # scripts that run just after the load event
        return self.browser.take_events(self.session)

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate JavaScript in the page; return its (JSON) value."""
        result = self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"JavaScript error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target_id})


def console_problems(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The errors among a page's events: uncaught exceptions, console.error and
    console.assert calls, and browser log entries of level error (which include
    resources that failed to load). Each is a dict with ``text`` and ``url``."""
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details["text"]
            problems.append({"text": text, "url": details.get("url", "")})
        elif method == "Runtime.consoleAPICalled" and params["type"] in (
            "error",
            "assert",
        ):
            text = " ".join(
                str(arg.get("value", arg.get("description", "")))
                for arg in params["args"]
            )
            problems.append({"text": f"console.{params['type']}: {text}", "url": ""})
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            problems.append({"text": entry["text"], "url": entry.get("url", "")})
    return problems


def requested_urls(events: list[dict[str, Any]]) -> list[str]:
    """Every URL the page asked for."""
    return [
        e["params"]["request"]["url"]
        for e in events
        if e["method"] == "Network.requestWillBeSent"
    ]
