"""Headless Chromium for the tests that render an HTML page (the token-credit view, the comparison report).

`needs_chromium` skips a test, saying how to get the browser, where none is installed; CI installs it (`.ci/run`).
"""

import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs headless chromium to render the page: apt-get install chromium"
)


def run_chromium(tmp_path, url, *mode):
    """Chromium's stdout for `url` in `mode` (`--dump-dom`, `--screenshot=PATH`), with a profile under `tmp_path`."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-color-profile=srgb",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1000,700",
        *mode,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def read_png(path):
    """An image file as integer RGB values, `(height, width, 3)` in 0-255."""
    import matplotlib.image

    image = matplotlib.image.imread(path)
    return (image[..., :3] * 255).round().astype(int)
