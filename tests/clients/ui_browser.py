"""Opens the gateway's dashboard in headless Chromium and reports what it shows.

Driven over the DevTools protocol (a page that keeps an EventSource open never
"finishes loading", so --dump-dom would wait forever): loads URL, waits for two
live updates, prints the slots the page shows as JSON, with the number of
updates seen one and a half seconds apart, and saves a screenshot.

    python ui_browser.py CHROMIUM URL SCREENSHOT
"""

import base64
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import websocket

chromium, url, screenshot = sys.argv[1:4]
profile = tempfile.mkdtemp(prefix="slotgate-ui-")
browser = subprocess.Popen(
    [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
     "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1",
     "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,900",
     "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
try:
    port = None
    deadline = time.time() + 60
    while port is None and time.time() < deadline:
        line = browser.stderr.readline()
        if not line and browser.poll() is not None:
            sys.exit(f"chromium exited: {browser.returncode}")
        m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
    if port is None:
        sys.exit("chromium did not open its DevTools port")
    # Keep reading its log, or a full pipe would stall it.
    threading.Thread(target=lambda: browser.stderr.read(), daemon=True).start()
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
    page = next(t for t in targets if t["type"] == "page")
    ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30,
                                     suppress_origin=True)
    next_id = 0

    def call(method, **params):
        global next_id
        next_id += 1
        ws.send(json.dumps({"id": next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(ws.recv())
            if reply.get("id") == next_id:
                if "error" in reply:
                    sys.exit(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(expression):
        result = call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    call("Page.enable")
    call("Page.navigate", url=url)
    updates = 0
    deadline = time.time() + 30
    while time.time() < deadline:
        updates = int(evaluate("Number(document.body && document.body.dataset.updates || 0)") or 0)
        if updates >= 2:
            break
        time.sleep(0.2)
    if updates < 2:
        sys.exit(f"the page was updated {updates} times in 30 s: {evaluate('document.body.innerText')}")
    shown = evaluate("""JSON.stringify([...document.querySelectorAll('.slot')].map(e => (
        {backend: e.dataset.backend, slot: Number(e.dataset.slot), phase: e.dataset.phase})))""")
    backends = evaluate("""JSON.stringify([...document.querySelectorAll('.backend')].map(e => (
        {url: e.dataset.url, state: e.dataset.state})))""")
    time.sleep(1.5)
    later = int(evaluate("Number(document.body.dataset.updates)"))
    shot = call("Page.captureScreenshot", format="png")
    with open(screenshot, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print(json.dumps({"slots": json.loads(shown), "backends": json.loads(backends),
                      "updates": [updates, later]}))
    ws.close()
finally:
    browser.terminate()
    try:
        browser.wait(10)
    except subprocess.TimeoutExpired:
        browser.kill()
