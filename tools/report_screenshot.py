"""The README's screenshot of the HTML report: a profile of a model of the zoo, opened in Debian's
headless Chromium (``apt-get install chromium chromium-driver``), a module clicked, then saved.

    python tools/report_screenshot.py                     # docs/report.png, of BERT-base (2 layers)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import profile_model, write_html  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(REPO / "docs" / "report.png"))
    options = parser.parse_args()
    import transformers
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    model = transformers.BertModel(config).eval()
    profile = profile_model(model, torch.randint(0, 1000, (1, 128)), repeats=10)
    page = Path(tempfile.mkdtemp()) / "report.html"
    write_html(profile, str(page))
    chrome = webdriver.ChromeOptions()
    chrome.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1320,620"):
        chrome.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")), options=chrome)
    try:
        driver.get(page.as_uri())
        driver.find_element(By.CSS_SELECTOR, '.icicle .box[data-name="encoder"]').click()
        driver.find_element(By.CSS_SELECTOR, '.icicle .box[data-name="encoder.layer.0.attention"]').click()
        Path(options.output).parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(options.output)
    finally:
        driver.quit()
    print(f"written: {options.output}")


if __name__ == "__main__":
    main()
