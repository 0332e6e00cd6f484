"""A page opened in a real headless Chromium, driven by the DevTools protocol over a pipe
(``--remote-debugging-pipe``: JSON messages ended by a NUL byte on fds 3 and 4; the protocol's
``Target``, ``Page``, ``Runtime``, ``Log`` and ``Emulation`` domains,
https://chromedevtools.github.io/devtools-protocol/). No Python package and no WebDriver: the
distribution's ``chromium`` package is all it takes."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (  # headless, as root, on a machine with no network: nothing started that would reach out
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)
CHECK = """JSON.stringify({
  images: [...document.images].map(i => ({src: i.src.slice(0, 60), alt: i.alt,
                                          loaded: i.complete && i.naturalWidth > 0})),
  scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth,
  wide: [...document.body.querySelectorAll('*')]
    .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
    .map(e => e.tagName + (e.className ? '.' + e.className : '')).slice(0, 10),
})"""


def browser() -> str | None:
    """The Chromium on this machine's path, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


@dataclass
class PageCheck:
    """What a page showed: its images (``loaded``: decoded, non-empty), its widths at the window's
    width, the elements reaching past it, and every console error, uncaught exception and
    browser log error (a resource that failed to load among them)."""

    images: list[dict]
    scroll_width: int
    client_width: int
    wide: list[str]
    errors: list[str] = field(default_factory=list)


class _Process:
    """The spawned browser: its exit code, once it has one, and its end."""

    def __init__(self, pid: int) -> None:
        self.pid, self.code = pid, None

    def poll(self) -> int | None:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
        if self.poll() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if self.code is None:
            os.kill(self.pid, signal.SIGKILL)
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


class _Pipe:
    def __init__(self, proc: _Process, to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buffer, self.next_id, self.events = b"", 0, []

    def send(self, method: str, session: str | None = None, **params) -> int:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        return self.next_id

    def receive(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise TimeoutError("Chromium sent nothing in time")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit code {self.proc.poll()})")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, deadline: float, session: str | None = None, **params) -> dict:
        wanted = self.send(method, session, **params)
        while True:
            message = self.receive(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, session: str, deadline: float) -> dict:
        for i, message in enumerate(self.events):
            if message.get("method") == method and message.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            message = self.receive(deadline)
            if message.get("method") == method and message.get("sessionId") == session:
                return message
            self.events.append(message)


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(
                "console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            )
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}".strip())
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(
                f"log ({p['entry']['source']}): {p['entry']['text']} {p['entry'].get('url', '')}".strip()
            )
    return out


def open_page(path: Path, width: int = 1280, height: int = 800, timeout: float = 60.0) -> PageCheck:
    """Open ``path`` (a file) in headless Chromium at ``width`` x ``height`` CSS pixels, wait for its
    load event and a moment for late errors, and report what it showed."""
    exe = browser()
    if exe is None:
        raise FileNotFoundError(f"no Chromium on the path (looked for {', '.join(BROWSERS)})")
    deadline = time.monotonic() + timeout
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    with tempfile.TemporaryDirectory() as profile:
        # the browser reads what we send on its fd 3 and writes its answers on its fd 4; nothing else
        # of ours is inherited (Python's descriptors close on exec). The pipe's ends are first moved
        # above 9 so that neither is 3 or 4 already
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w))
        argv = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        pid = os.posix_spawn(
            exe,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, r, 3),
                (os.POSIX_SPAWN_DUP2, w, 4),
            ],
        )
        for fd in (to_browser_r, from_browser_w, r, w):
            os.close(fd)
        proc = _Process(pid)
        pipe = _Pipe(proc, to_browser_w, from_browser_r)
        try:
            target = pipe.call("Target.createTarget", deadline, url="about:blank")["targetId"]
            session = pipe.call("Target.attachToTarget", deadline, targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.call(f"{domain}.enable", deadline, session)
            pipe.call(
                "Emulation.setDeviceMetricsOverride",
                deadline,
                session,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            pipe.call("Page.navigate", deadline, session, url=path.resolve().as_uri())
            pipe.wait_for("Page.loadEventFired", session, deadline)
            time.sleep(0.5)  # errors logged just after the load event
            result = pipe.call("Runtime.evaluate", deadline, session, expression=CHECK, returnByValue=True)
            seen = json.loads(result["result"]["value"])
            pipe.call("Runtime.evaluate", deadline, session, expression="0")  # flush queued events
            errors = _errors([e for e in pipe.events if e.get("sessionId") == session])
        finally:
            os.close(to_browser_w)
            os.close(from_browser_r)
            proc.stop()
    return PageCheck(seen["images"], seen["scrollWidth"], seen["clientWidth"], seen["wide"], errors)
