"""Acceptance 3: the report renders, its images decode, and every number in it comes from the measurements.

The HTML is parsed with the standard library: each inline ``<svg>`` must parse as XML, every plotted point's
tooltip must name a real measurement, and each numeric cell of the summary table must equal (to its printed
precision) the checkpoint figure it stands for. When Debian's ``chromium`` is installed the page is also
rendered headless and screenshotted.
"""

from __future__ import annotations

import csv
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from serving_pod.analyzer.checkpoint import Checkpoint
from serving_pod.analyzer.cli import main
from serving_pod.analyzer.measure import Measurement, failed

SVG_NS = "{http://www.w3.org/2000/svg}"
TIP = re.compile(r"^(?P<key>\S+) c=(?P<c>\d+): (?P<t>[0-9.]+) infer/s, p99 (?P<p>[0-9.]+) ms"
                 r"( \(median of (?P<n>\d+) runs\))?$")


class Page(HTMLParser):
    """Collects the summary table's rows (cells with their class) and every external reference."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str]]] = []
        self.in_summary = False
        self.cell: list[str] | None = None
        self.cell_class = ""
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("src", "href"):
            if values.get(name):
                self.external.append(f"{tag} {name}={values[name]}")
        if tag in ("script", "link", "iframe", "img"):
            self.external.append(tag)
        if tag == "table" and values.get("id") == "summary":
            self.in_summary = True
        elif self.in_summary and tag == "tr":
            self.rows.append([])
        elif self.in_summary and tag == "td":
            self.cell, self.cell_class = [], values.get("class") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.in_summary = False
        elif tag == "td" and self.cell is not None:
            self.rows[-1].append(("".join(self.cell).strip(), self.cell_class))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def render(checkpoint_dir: Path, out: Path) -> tuple[str, Path]:
    html_path = out / "report.html"
    assert main(["report", "--checkpoint-directory", str(checkpoint_dir), "--output", str(html_path)]) == 0
    return html_path.read_text(), html_path.with_suffix(".csv")


def svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(block) for block in re.findall(r"<svg\b.*?</svg>", html, flags=re.S)]


def close(printed: str, value: float, digits: int) -> bool:
    return abs(float(printed) - value) <= 0.5 * 10 ** -digits + 1e-9


def test_report_of_a_real_sweep(sweep, tmp_path: Path) -> None:
    assert sweep.code == 0, sweep.stdout
    html, csv_path = render(sweep.root / "ck", tmp_path)
    medians = sweep.medians()  # (config, concurrency) -> (throughput, p99, runs)

    page = Page()
    page.feed(html)
    assert page.external == []  # self-contained

    charts = svgs(html)
    assert len(charts) == 3  # throughput vs p99, latency breakdown, memory vs latency
    points = charts[0].findall(f".//{SVG_NS}circle[@class='pt']")
    assert len(points) == len(medians)
    for circle in points:
        tip = TIP.match(circle.find(f"{SVG_NS}title").text)
        throughput, p99, runs = medians[(tip["key"], int(tip["c"]))]
        assert close(tip["t"], throughput, 1) and close(tip["p"], p99, 3)
        assert int(tip["n"] or 1) == runs
    bars = charts[1].findall(f".//{SVG_NS}rect[@class='bar']")
    assert len(bars) == 2 * len({key for key, _ in medians})  # queue + compute per configuration

    result = sweep.checkpoint["models"]["mlp_onnx"]["result"]
    best, default = result["recommended"], result["default"]
    best_t, best_p, _ = medians[(best["config_key"], best["concurrency"])]
    default_t, default_p, _ = medians[(default["config_key"], default["concurrency"])]
    (row,) = page.rows[1:]
    texts = [text for text, _ in row]
    assert texts[0] == "mlp_onnx" and texts[2] == best["config_key"] and texts[6] == default["config_key"]
    numbers = [text for text, cls in row if cls == "num"]
    expected = [(best["concurrency"], 0), (best_t, 1), (best_p, 3), (default["concurrency"], 0), (default_t, 1),
                (default_p, 3), ((best_t / default_t - 1) * 100, 1)]
    assert len(numbers) == len(expected)
    for printed, (value, digits) in zip(numbers, expected):
        assert close(printed, value, digits), (printed, value)
    assert close(numbers[-1], result["gain"] * 100, 1)

    rows = list(csv.DictReader(csv_path.open()))
    runs = {(m.config_key, m.concurrency, m.trial): m for m in sweep.measurements()}
    assert len(rows) == len(runs)  # every run, verification trials included
    for item in rows:
        m = runs[(item["config_key"], int(item["concurrency"]), int(item["trial"]))]
        assert float(item["throughput"]) == m.throughput and float(item["p99_ms"]) == m.p99_ms


def test_unfinished_and_infeasible_models(tmp_path: Path) -> None:
    ck = Checkpoint.open(tmp_path / "ck", settings={"load_generator": "builtin", "window": "w"})
    for key, c, t, p in (("i1-b8-nodb", 1, 100.0, 2.0), ("i1-b8-nodb", 2, 180.0, 3.5)):
        ck.record(Measurement("half_done", key, c, t, p, queue_us=10.0, compute_us=900.0, rss_mb=50.0))
    ck.record(failed("half_done", "i2-b8-nodb", 1, "perf_analyzer exited 1", "w"))
    ck.record(Measurement("too_slow", "i1-b0-nodb", 1, 50.0, 9.0, queue_us=1.0, compute_us=2.0))
    ck.set_result("too_slow", {"objective": {"kind": "latency", "throughput_weight": 1, "latency_weight": 1},
                               "constraints": {"max_p99_ms": 1.0, "min_throughput": None, "max_memory_mb": None},
                               "default_key": "i1-b0-nodb", "recommended": None, "default": None, "gain": None,
                               "message": "no configuration of 'too_slow' meets the constraints (p99 <= 1 ms)"})
    html, csv_path = render(tmp_path / "ck", tmp_path)
    page = Page()
    page.feed(html)
    statuses = {row[0][0]: row[1][0] for row in page.rows[1:]}
    assert statuses == {"half_done": "sweep not finished", "too_slow": "no config meets the constraints"}
    assert all(text == "–" for row in page.rows[1:] for text, cls in row if cls == "num")
    assert "p99 9.000 ms &gt; budget 1 ms" in html
    for chart in svgs(html):
        assert chart.tag == f"{SVG_NS}svg"
    assert len(list(csv.DictReader(csv_path.open()))) == 4


def test_report_refuses_an_empty_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Checkpoint.open(tmp_path, settings={}).save()
    assert main(["report", "--checkpoint-directory", str(tmp_path), "--output", str(tmp_path / "r.html")]) == 2
    assert "holds no measurements yet" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_report_renders_in_headless_chromium(sweep, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian package `chromium`)")
    html_path = tmp_path / "report.html"
    render(sweep.root / "ck", tmp_path)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-500:]
    assert dom.stdout.count("<svg") == 3 and 'id="summary"' in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run([*flags, "--window-size=1400,1600", f"--screenshot={shot}", html_path.as_uri()],
                   capture_output=True, timeout=90, check=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 1600)
