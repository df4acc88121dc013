"""Every measured figure the README and the documentation state is one the benchmarks page records, where each
measurement has its command, the machine, the date and the commit: a figure beside a link to a section of
docs/benchmarks.md is in that section, the README's performance table links a section from each row and
states its figures as written there, and any other figure is somewhere on the page, or is a setting (a
default, a limit, an option's value) listed below with what it is.

A page's figures are the numbers with a unit of measurement (µs, ms, s, times, %, MiB, req/s, ...) in its text,
its tables and its ``text`` blocks (sample output); inline code and other code blocks hold settings and are
left out. A figure is stated by the page when it is there as written, or as a more precise figure of the
same unit that rounds to it (19 s for 19.0 s). docs/cuda-facts.md is a record of its own (its runs' script,
commit, date and machine, and their log), the changelog is history, and the API pages are generated."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "docs" / "benchmarks.md"
OWN_RECORDS = {"benchmarks.md", "cuda-facts.md", "changelog.md"}

#: The pages' typography: the multiplication sign of ratios, the en dash of ranges, the minus sign.
TIMES, DASH, MINUS = "\N{MULTIPLICATION SIGN}", "\N{EN DASH}", "\N{MINUS SIGN}"

#: Settings, limits and illustrations, not measurements: a page, a figure as written, and what it is.
SETTINGS: dict[tuple[str, str], str] = {
    ("docs/architecture.md", "1 ms"): "cuda_launch_inline_us's default",
    ("docs/architecture.md", "20 µs"): "inline_threshold_us's default",
    ("docs/guide/batching.md", "3 µs"): "the one-row replay under which calls run inline (INLINE_US)",
    ("docs/guide/batching.md", "10 µs"): "the one-row replay under which the engine warns (HANDOFF_US)",
    ("docs/guide/batching.md", "150 µs"): "the value of batch_latency.py's --request-us",
    ("docs/guide/dask.md", "20 s"): "how long aclose() waits for the Dask client",
    ("docs/guide/dask.md", "8 MB"): "an 8 MB matrix at an assumed 1 GB/s",
    ("docs/guide/dask.md", "8 ms"): "an 8 MB matrix at an assumed 1 GB/s",
    ("docs/guide/gpus.md", "1 ms"): "cuda_launch_inline_us's default",
    ("docs/guide/gpus.md", "32 MiB"): "the cuBLAS workspace set per stream",
    ("docs/guide/observing.md", "10 µs"): "the bottom histogram bucket",
    ("docs/guide/observing.md", "10 s"): "the top histogram bucket",
    ("docs/guide/observing.md", "50 ms"): "the latency budget given to schedsvc tune",
    ("docs/guide/serving.md", "1 MiB"): "schedsvc.serving's body limit",
    ("docs/guide/serving.md", "64 KiB"): "serve.py's body limit",
    ("docs/guide/serving.md", "16 KiB"): "the example's body limit",
    ("docs/guide/submitting.md", "2 ms"): "how long staged work waits for the loop before a worker takes it",
    ("docs/guide/submitting.md", "20 µs"): "inline_threshold_us's default",
}

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
#: A unit after a space; the times sign and percent right after the number, as ratios are written (a spaced
#: times sign is an operator: 8 x np.dot).
_UNIT = rf" (?:µs|ms|s|KiB|MiB|GiB|MB|GB|req/s|calls/s|items/s|tasks/s)|{TIMES}|%"
_FIGURE = re.compile(rf"(?<![\w.,/{MINUS}+-])({_NUMBER}(?:{DASH}{_NUMBER})?)({_UNIT})(?![\w/])")
_FENCE = re.compile(r"^( *)(`{3,}|~{3,})(\S*)[^\n]*\n(.*?)^\1\2 *$", re.MULTILINE | re.DOTALL)
_CITATION = re.compile(r"benchmarks\.md#([\w-]+)")
_HEADING = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)
_ITEM = re.compile(r"^ {0,3}(?:[-*]|\d+\.) ")


class Figure(NamedTuple):
    written: str
    number: str
    unit: str


def figures(text: str) -> list[Figure]:
    """The measured figures of a piece of prose (inline code left out), in order."""
    text = re.sub(r"`[^`\n]*`", "code", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    return [Figure(m.group(0), m.group(1), m.group(2).strip()) for m in _FIGURE.finditer(text)]


def prose(markdown: str) -> str:
    """The page with its code blocks blanked out, line for line; ``text`` blocks (sample output) stay."""

    def blank(block: re.Match[str]) -> str:
        kept = block.group(3) == "text"
        return "\n".join(line if kept else "" for line in block.group(0).split("\n"))

    return _FENCE.sub(blank, markdown)


def units(markdown: str) -> list[tuple[int, str]]:
    """A page's paragraphs, list items and table rows, each with its first line's number, as prose."""
    found: list[tuple[int, list[str]]] = []
    new = True
    for number, line in enumerate(prose(markdown).splitlines(), 1):
        if not line.strip():
            new = True
        elif new or line.lstrip().startswith("|") or _ITEM.match(line):
            found.append((number, [line]))
            new = line.lstrip().startswith("|")
        else:
            found[-1][1].append(line)
    return [(number, "\n".join(lines)) for number, lines in found]


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def sections(markdown: str) -> dict[str, str]:
    """Each heading's anchor and its text, subsections included, up to the next heading as high."""
    headings = list(_HEADING.finditer(markdown))
    found = {}
    for i, heading in enumerate(headings):
        level = len(heading.group(1))
        end = next((h.start() for h in headings[i + 1 :] if len(h.group(1)) <= level), len(markdown))
        found[slug(heading.group(2))] = markdown[heading.start() : end]
    return found


def _written(number: str, unit: str) -> str:
    return f"{number}{unit}" if unit in (TIMES, "%") else f"{number} {unit}"


def _decimals(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


def _value(number: str) -> Decimal:
    return Decimal(number.replace(",", ""))


def stated(figure: Figure, source: str, rounded: bool = True) -> bool:
    """Whether ``source`` states the figure: as written (its number alone where that is specific: a range,
    a decimal or a thousands separator), a range as its two ends, or, with ``rounded``, as a figure of the
    same unit that rounds to it."""
    if re.search(rf"(?<![\d.,{DASH}]){re.escape(figure.written)}(?![\w/])", source):
        return True
    specific = re.search(rf"[.,{DASH}]", figure.number)
    if specific and re.search(rf"(?<![\d.,]){re.escape(figure.number)}(?![\d]|[.,]\d)", source):
        return True
    if DASH in figure.number:
        ends = [Figure(_written(end, figure.unit), end, figure.unit) for end in figure.number.split(DASH)]
        return all(stated(end, source, rounded=False) for end in ends)
    if not rounded:
        return False
    places = Decimal(1).scaleb(-_decimals(figure.number))
    return any(
        _decimals(other.number) > _decimals(figure.number)
        and _value(other.number).quantize(places, ROUND_HALF_UP) == _value(figure.number)
        for other in figures(source)
        if other.unit == figure.unit and DASH not in other.number
    )


def pages() -> list[Path]:
    docs = sorted(
        page
        for page in (REPO / "docs").rglob("*.md")
        if page.name not in OWN_RECORDS and "api" not in page.relative_to(REPO / "docs").parts
    )
    return [REPO / "README.md", *docs]


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def test_figures_are_read_and_matched_as_written() -> None:
    x, to = TIMES, DASH
    text = f"took 19 s, 2.05{x} faster, `--max-latency 50ms`, 8 {x} np.dot, 503s and 5,423 req/s (64-10)"
    assert [f.written for f in figures(text)] == ["19 s", f"2.05{x}", "5,423 req/s"]
    assert stated(Figure("19 s", "19", "s"), "| 19.0 s |")
    assert not stated(Figure("19 s", "19", "s"), "| 19.0 s |", rounded=False)
    assert not stated(Figure("3 ms", "3", "ms"), "2.97 µs and 3.1 s")
    assert not stated(Figure("4%", "4", "%"), "about 14%") and not stated(Figure("2 ms", "2", "ms"), "32 ms")
    assert stated(Figure("9,278 req/s", "9,278", "req/s"), f"| `batched` | 9,278 | 0.53{x} |")
    assert not stated(Figure(f"1.3{x}", "1.3", x), f"1.32{x} and 1.94{x}", rounded=False)
    assert stated(Figure(f"9.9{to}10.1 s", f"9.9{to}10.1", "s"), "10.1 s, 9.9 s")
    assert not stated(Figure(f"9{to}13 s", f"9{to}13", "s"), f"9.9{to}10.1 s")
    assert units("a\nb\n\n- c\n  d\n- e\n\n| f |\n| g |\n```python\nx = 1 s\n```\n") == [
        (1, "a\nb"),
        (4, "- c\n  d"),
        (6, "- e"),
        (8, "| f |"),
        (9, "| g |"),
    ]
    assert slug("Batched calls on the event loop, 2026-11-29") == "batched-calls-on-the-event-loop-2026-11-29"


def test_every_figure_of_the_readme_s_performance_table_is_the_section_s_it_links() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| what ")]
    bench = sections(BENCHMARKS.read_text(encoding="utf-8"))
    assert len(rows) >= 8
    checked = 0
    for row in rows:
        cited = _CITATION.findall(row)
        assert cited and all(anchor in bench for anchor in cited), f"link a section of benchmarks.md: {row}"
        for figure in figures(row):
            checked += 1
            assert any(stated(figure, bench[a], rounded=False) for a in cited), f"{figure.written}: {row}"
    assert checked >= 15


def test_a_figure_beside_a_link_to_the_benchmarks_page_is_in_the_section_it_links() -> None:
    bench = sections(BENCHMARKS.read_text(encoding="utf-8"))
    missing = []
    for page in pages():
        for line, text in units(page.read_text(encoding="utf-8")):
            cited = _CITATION.findall(text)
            assert all(anchor in bench for anchor in cited), f"{_name(page)}:{line}: no such section"
            missing += [
                f"{_name(page)}:{line}: {figure.written} (#{', #'.join(cited)})"
                for figure in figures(text)
                if cited
                and (_name(page), figure.written) not in SETTINGS
                and not any(stated(figure, bench[anchor]) for anchor in cited)
            ]
    assert missing == [], "state the section's figure, or record the measurement there"


def test_every_other_measured_figure_is_on_the_benchmarks_page() -> None:
    bench = BENCHMARKS.read_text(encoding="utf-8")
    missing = []
    for page in pages():
        for line, text in units(page.read_text(encoding="utf-8")):
            missing += [
                f"{_name(page)}:{line}: {figure.written}"
                for figure in figures(text)
                if not _CITATION.search(text)
                and (_name(page), figure.written) not in SETTINGS
                and not stated(figure, bench)
            ]
    assert missing == [], "record the measurement on docs/benchmarks.md (or list a setting in SETTINGS)"


def test_each_listed_setting_is_still_stated() -> None:
    texts = {page: page.read_text(encoding="utf-8") for page in pages()}
    gone = [
        f"{name}: {written}"
        for name, written in SETTINGS
        if written not in {f.written for f in figures(prose(texts[REPO / name]))}
    ]
    assert gone == [], "drop the entry from SETTINGS"
