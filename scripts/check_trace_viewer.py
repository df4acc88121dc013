"""Open schedsvc traces in the chrome://tracing viewer (Catapult's trace viewer) and check what it read.

    python scripts/check_trace_viewer.py run.json [more.json ...] [--out trace-check]

Catapult's trace viewer is the code behind chrome://tracing.  Chrome builds
without it (Debian's Chromium has no chrome://tracing), so this script takes
the standalone build that XProf ships (``xprof/static/trace_viewer_index.*``
in the ``xprof`` wheel, downloaded once with ``pip download --no-deps``),
loads it in headless Chromium, imports each trace with the viewer's own
importer (``tr.importer.Import``), and checks that

* the importer reports no warnings,
* every span (``ph: "X"``) became a slice on a track named as in the file,
* every flow arrow bound a span at each end (the task numbers are printed),
* both counter tracks are there with a sample per counter event;

then it shows the trace in the viewer's timeline and writes screenshots
(``NAME.png``, and ``NAME.selected.png`` with the first span that has inputs
selected: its arguments and flows in the panel below).  Exit status 1 if a
check fails.

Needs: Chromium (``apt-get install chromium``), ``pip install playwright``
(its bundled driver drives the system Chromium; no browser download), and
PyPI reachable for the wheel (about 32 MB).  Not part of the test suite: CI
has no browser.  The file format itself is checked by tests/runtime/test_trace.py.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

XPROF = "xprof==2.24.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "schedsvc" / "trace-viewer"
STATIC = ("xprof/static/trace_viewer_index.html", "xprof/static/trace_viewer_index.js")

# runs in the page: import with the viewer's importer, describe the model; then show it
PAGE_SCRIPT = """
<script>
window.importTrace = async function(url) {
  const text = await (await fetch(url)).text();
  const model = new tr.Model();
  new tr.importer.Import(model).importTraces([text]);
  window.model = model;
  const out = {warnings: model.importWarnings.map(w => w.type + ': ' + w.message),
               tracks: [], counters: [], flows: []};
  for (const p of Object.values(model.processes)) {
    for (const t of Object.values(p.threads)) {
      out.tracks.push({name: t.name, slices: t.sliceGroup.slices.length});
    }
    for (const c of Object.values(p.counters)) {
      out.counters.push({name: c.name, samples: c.series.map(s => s.samples.length)});
    }
  }
  for (const f of model.flowEvents) {
    out.flows.push([f.startSlice ? f.startSlice.args.task : null, f.endSlice ? f.endSlice.args.task : null]);
  }
  return out;
};
window.showTrace = function() {
  const old = document.getElementById('trace-viewer');
  if (old) old.remove();
  const container = document.createElement('track-view-container');
  container.id = 'track_view_container';
  const view = document.createElement('tr-ui-timeline-view');
  view.track_view_container = container;
  Polymer.dom(view).appendChild(container);
  view.id = 'trace-viewer';
  view.globalMode = true;
  view.style.height = '880px';
  Polymer.dom(document.body).appendChild(view);
  view.model = window.model;
};
window.showFlows = function() {
  const view = document.getElementById('trace-viewer');
  if (!view || !view.trackView) return false;
  view.trackView.viewport.showFlowEvents = true;
  return true;
};
window.selectSpanWithInputs = function() {
  const view = document.getElementById('trace-viewer');
  for (const p of Object.values(window.model.processes)) {
    for (const t of Object.values(p.threads)) {
      for (const s of t.sliceGroup.slices) {
        if (s.inFlowEvents.length && s.args.shapes) {
          view.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([s]));
          return s.title;
        }
      }
    }
  }
  return null;
};
</script>
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def viewer_files() -> Path:
    """The viewer's two files, from the xprof wheel (downloaded once into the cache)."""
    folder = CACHE / XPROF.replace("==", "-")
    if all((folder / Path(name).name).exists() for name in STATIC):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", XPROF, "-d", tmp], check=True
        )
        (wheel,) = Path(tmp).glob("xprof-*.whl")
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for name in STATIC:
                (folder / Path(name).name).write_bytes(zf.read(name))
    return folder


def build_site(site: Path, traces: list[Path]) -> None:
    files = viewer_files()
    shutil.copy(files / "trace_viewer_index.js", site)
    html = (files / "trace_viewer_index.html").read_text()
    app = '<tf-trace-viewer></tf-trace-viewer><script src="trace_viewer_index.js"></script>'
    if app not in html:
        raise SystemExit(f"{XPROF}: trace_viewer_index.html is not laid out as this script expects")
    (site / "viewer.html").write_text(
        html.replace(app, '<script src="trace_viewer_index.js"></script>' + PAGE_SCRIPT)
    )
    for i, trace in enumerate(traces):
        shutil.copy(trace, site / f"trace{i}.json")


def expected(trace: Path) -> dict[str, Any]:
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans: dict[str, int] = {}
    for e in events:
        if e["ph"] == "X":
            spans[names[e["tid"]]] = spans.get(names[e["tid"]], 0) + 1
    counters: dict[str, int] = {}
    for e in events:
        if e["ph"] == "C":
            counters[e["name"]] = counters.get(e["name"], 0) + 1
    return {"spans": spans, "flows": sum(e["ph"] == "s" for e in events), "counters": counters}


def check(trace: Path, seen: dict[str, Any]) -> list[str]:
    want = expected(trace)
    problems = [f"import warning: {w}" for w in seen["warnings"]]
    got = {t["name"]: t["slices"] for t in seen["tracks"] if t["slices"]}
    if got != want["spans"]:
        problems.append(f"slices per track {got}, the file has {want['spans']}")
    bound = [f for f in seen["flows"] if None not in f]
    if len(bound) != want["flows"]:
        problems.append(f"{len(bound)} flows bound at both ends, the file has {want['flows']}")
    counters = {c["name"]: c["samples"] for c in seen["counters"]}
    for name, n in want["counters"].items():
        if counters.get(name) != [n]:
            problems.append(f"counter {name!r}: samples {counters.get(name)}, the file has {n}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("trace-check"), help="where the screenshots go")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        build_site(site, args.traces)
        handler = functools.partial(_QuietHandler, directory=str(site))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=args.chromium,
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
                )
                page = browser.new_page(viewport={"width": 1600, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"http://127.0.0.1:{server.server_port}/viewer.html")
                page.wait_for_function("() => Boolean(window.tr && window.importTrace)", timeout=60_000)
                for i, trace in enumerate(args.traces):
                    seen = page.evaluate(f"window.importTrace('trace{i}.json')")
                    problems = check(trace, seen)
                    page.evaluate("window.showTrace()")
                    page.wait_for_function("() => window.showFlows()", timeout=30_000)
                    page.wait_for_timeout(1000)
                    page.screenshot(path=str(args.out / f"{trace.stem}.png"))
                    picked = page.evaluate("window.selectSpanWithInputs()")
                    page.wait_for_timeout(500)
                    page.screenshot(path=str(args.out / f"{trace.stem}.selected.png"))
                    problems += [f"page error: {e}" for e in errors]
                    errors.clear()
                    tracks = ", ".join(f"{t['name']} ({t['slices']})" for t in seen["tracks"] if t["slices"])
                    counters = ", ".join(f"{c['name']} ({c['samples'][0]})" for c in seen["counters"])
                    print(f"{trace}: {'FAILED' if problems else 'ok'}")
                    print(f"  tracks (slices): {tracks}")
                    print(f"  counters (samples): {counters}")
                    print(f"  flows (parent task -> child task): {seen['flows']}")
                    print(f"  selected: {picked}; screenshots in {args.out}/")
                    for problem in problems:
                        print(f"  problem: {problem}")
                    failed |= bool(problems)
                browser.close()
        finally:
            server.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
