"""The end-of-run report as a reader sees it: ``report.html`` of a tiny run opened in a real headless
Chromium (the distribution's ``chromium`` package; skipped, with the reason, where it is absent):
every image loads, the console shows no error, nothing reaches past a 1280-pixel window. The checker
itself is shown to see each fault on a page made to have it."""

from __future__ import annotations

import pytest

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.browser import browser, open_page
from tests.conftest import TINY_RUN, tiny_overrides

pytestmark = pytest.mark.skipif(
    browser() is None,
    reason="no Chromium on the path: install the distribution's package (Debian: apt-get install chromium)",
)


def test_the_report_of_a_tiny_run_shows_every_image_no_error_and_fits_1280_px(tmp_path):
    config = load_config("recipes/tiny_demo.yaml", tiny_overrides(tmp_path, **TINY_RUN))
    report = train(config).output_dir / "report.html"
    page = open_page(report, width=1280)
    assert len(page.images) >= 3, page.images  # the curves, the grids of the first and last evals at least
    assert [i for i in page.images if not i["loaded"]] == []
    assert page.errors == []
    assert page.scroll_width <= page.client_width, page.wide
    assert page.wide == []


def test_the_checker_sees_a_broken_image_a_console_error_and_a_page_too_wide(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!doctype html><html><body>"
        '<img src="data:image/png;base64,iVBORw0KGgo=" alt="truncated png">'
        '<img src="missing.png" alt="no such file">'
        '<div style="width: 1500px">wide</div>'
        "<script>console.error('a console error'); undefined_function();</script>"
        "</body></html>"
    )
    seen = open_page(page, width=1280)
    assert [i["loaded"] for i in seen.images] == [False, False]
    assert any("a console error" in e for e in seen.errors)
    assert any("undefined_function" in e for e in seen.errors)
    assert any("missing.png" in e for e in seen.errors)  # the file that failed to load, logged
    assert seen.scroll_width > seen.client_width and "DIV" in seen.wide
