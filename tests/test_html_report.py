"""The HTML report in a real browser: Debian's headless Chromium through Selenium.

CI gets the browser with ``apt-get install chromium chromium-driver`` (the README's test command
does it); without it these tests are skipped, and say why.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis, memory_footprint, profile_model, write_html
from jitflops.examples import TinyTransformer

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="no Debian chromium and chromium-driver: apt-get install chromium chromium-driver")

PEAK = 2e12
IDS = torch.randint(0, 1000, (2, 16))


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = TinyTransformer(depth=2)
        self.unused = nn.Linear(4, 4)

    def forward(self, ids):
        return self.body(ids)


@pytest.fixture(scope="module")
def profile():
    return profile_model(WithUnused().eval(), IDS, repeats=3, peak_flops=PEAK)


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def page(profile, browser, tmp_path):
    path = tmp_path / "report.html"
    write_html(profile, str(path))
    browser.get(path.as_uri())
    return browser


def _box(page, name):
    return page.find_element(By.CSS_SELECTOR, f'.icicle .box[data-name="{name}"]')


def _width(page, name) -> float:
    return float(_box(page, name).find_element(By.TAG_NAME, "rect").get_attribute("width"))


def test_boxes_show_name_type_and_share_and_uncalled_modules_look_different(page, profile):
    boxes = page.find_elements(By.CSS_SELECTOR, ".icicle .box")
    assert len(boxes) == sum(1 for _ in profile.root.walk())
    body = _box(page, "body")
    text = body.find_element(By.TAG_NAME, "text").text
    share = 100 * profile.root.find("body").latency.median / profile.root.latency.median
    assert "body" in text and "TinyTransformer" in text and f"{share:.1f}%" in text
    assert "no-value" in _box(page, "unused").get_attribute("class")
    assert "no-value" not in body.get_attribute("class")
    rects = [float(b.find_element(By.TAG_NAME, "rect").get_attribute("x")) + float(b.find_element(By.TAG_NAME, "rect").get_attribute("width")) for b in boxes]
    assert max(rects) <= 900.01  # nothing overflows the drawing


def test_clicking_a_box_focuses_it_with_a_breadcrumb_and_details(page, profile):
    _box(page, "body.blocks").click()
    crumbs = page.find_element(By.CSS_SELECTOR, ".crumbs").text
    assert crumbs.split(" › ") == ["model", "body", "blocks"]
    assert _width(page, "body.blocks") == pytest.approx(899)  # the focus fills the width
    assert not page.find_elements(By.CSS_SELECTOR, '.icicle .box[data-name="body.embed"]')
    details = page.find_element(By.CSS_SELECTOR, ".details").text
    blocks = profile.root.find("body.blocks")
    assert "ModuleList" in details and f"{blocks.params:,}" in details and "top ops" in details and "linear" in details
    page.find_element(By.CSS_SELECTOR, '.crumbs span[data-name=""]').click()
    assert page.find_element(By.CSS_SELECTOR, ".crumbs").text == "model"


def test_the_metric_switch_resizes_recolours_and_relabels(page, profile):
    Select(page.find_element(By.CSS_SELECTOR, "select.metric")).select_by_value("params")
    assert page.find_element(By.CSS_SELECTOR, ".legend-label").text.startswith("parameters:")
    body = profile.root.find("body")
    embed, head = body.find("body.embed"), body.find("body.head")
    assert _width(page, "body.embed") / _width(page, "body.head") == pytest.approx(embed.params / head.params, rel=0.02)
    Select(page.find_element(By.CSS_SELECTOR, "select.metric")).select_by_value("mfu")
    title = _box(page, "body.head").find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert f"MFU {100 * head.flops_per_second / PEAK:.2f}%" in title


def test_the_roofline_plots_timed_modules_under_the_roofs(page, profile):
    Select(page.find_element(By.CSS_SELECTOR, "select.view")).select_by_value("roofline")
    points = page.find_elements(By.CSS_SELECTOR, ".roofline circle.point")
    timed = [node for node in profile.root.walk() if node.flops_per_second and node.flops]
    assert len(points) == len(timed) and page.find_elements(By.CSS_SELECTOR, ".roofline polyline.roof")
    assert "peak 2.00 TFLOP/s" in page.find_element(By.CSS_SELECTOR, ".roof-note").text
    assert {p.get_attribute("class").split()[1] for p in points} <= {"memory-bound", "compute-bound"}
    assert all(node.bytes > 0 for node in timed)  # placed by the bytes their ops move (ByteCountAnalysis)
    assert "arithmetic intensity (FLOPs per byte its ops read and write, log)" in page.find_element(By.CSS_SELECTOR, ".roofline").get_attribute("innerHTML")


def _png_is_not_blank(png: bytes) -> bool:
    """Enough distinct byte values in the decompressed image data: not one flat colour."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data = 8, b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        if kind == b"IDAT":
            data += png[position + 8:position + 8 + length]
        position += 12 + length
    return len(set(zlib.decompress(data))) > 40


def test_a_screenshot_has_content(page, tmp_path):
    shot = tmp_path / "report.png"
    page.save_screenshot(str(shot))
    assert _png_is_not_blank(shot.read_bytes())


def test_notebooks_show_profiles_and_analyses_inline(profile):
    cell = profile._repr_html_()
    assert cell.startswith('<div class="jf"') and "<html" not in cell
    analysis_cell = FlopCountAnalysis(TinyTransformer(), IDS)._repr_html_()
    assert "not timed" in analysis_cell and "TinyTransformer" in analysis_cell


def test_an_untimed_report_says_so_in_the_roofline(browser, tmp_path):
    path = Path(tmp_path) / "untimed.html"
    write_html(profile_model(TinyTransformer(), IDS, timed=False), str(path))
    browser.get(path.as_uri())
    Select(browser.find_element(By.CSS_SELECTOR, "select.view")).select_by_value("roofline")
    assert "No module was timed" in browser.find_element(By.CSS_SELECTOR, ".roof-note").text


def test_the_memory_view_sizes_boxes_by_estimated_bytes_and_shows_the_peak(browser, tmp_path):
    module = WithUnused().eval()
    estimate = memory_footprint(module, (IDS,), train="adamw")
    path = Path(tmp_path) / "memory.html"
    write_html(profile_model(module, IDS, timed=False), str(path), memory=estimate)
    browser.get(path.as_uri())
    note = browser.find_element(By.CSS_SELECTOR, ".memory-note").text
    assert "training step (adamw)" in note and "in the optimizer" in note
    segments = browser.find_elements(By.CSS_SELECTOR, ".membar div")
    widths = {s.get_attribute("class").removeprefix("mem-"): s.size["width"] for s in segments}
    params = sum(p.numel() for p in module.parameters())
    unused = set(module.unused.parameters())  # never called: no gradient, no state
    trained = params - sum(p.numel() for p in unused)
    steps = sum(1 for p in module.parameters() if p not in unused)
    assert estimate.at_peak["parameters"] == 4 * params and estimate.at_peak["gradients"] == 4 * trained  # fp32
    assert estimate.at_peak["optimizer_state"] == 8 * trained + 4 * steps  # AdamW: exp_avg, exp_avg_sq, a float32 step per tensor
    assert widths["optimizer_state"] / widths["gradients"] == pytest.approx(2, rel=0.02)
    Select(browser.find_element(By.CSS_SELECTOR, "select.metric")).select_by_value("memory")
    body = estimate.modules["body"]
    embed, head = estimate.modules["body.embed"], estimate.modules["body.head"]
    assert embed.total == 4 * embed.parameters + 4  # weight, gradient, 2 states and a step; it saves only the ids, an input
    assert _width(browser, "body.embed") / _width(browser, "body.head") == pytest.approx(embed.total / head.total, rel=0.02)
    _box(browser, "body").click()
    details = browser.find_element(By.CSS_SELECTOR, ".details").text
    assert "memory: optimizer state" in details and "memory: saved activations" in details
    assert f"{body.total / 2**20:.2f} MiB" in _box(browser, "body").find_element(By.TAG_NAME, "title").get_attribute("textContent")
