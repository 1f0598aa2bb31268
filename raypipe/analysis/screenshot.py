"""Screenshot an HTML page with headless Chromium and check the image is not blank.

Used to check the report renders as a page with real plots (tests, ``jobs/report.py --screenshot``) and that
``raypipe dashboard`` serves TensorBoard (a URL, with time for its scripts to draw).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class ScreenshotError(RuntimeError):
    pass


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _headless(html: Path | str, action: list[str], timeout: float, settle_ms: int) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``html`` (a local file, or an http(s) URL) with ``action``'s flags."""
    browser = find_browser()
    if browser is None:
        raise ScreenshotError(
            f"no headless browser found (tried {', '.join(BROWSERS)}); install one, e.g. `apt-get install -y chromium`"
        )
    with tempfile.TemporaryDirectory(prefix="raypipe-chromium-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *action,
            *([f"--virtual-time-budget={settle_ms}"] if settle_ms else []),
            html if str(html).startswith(("http://", "https://")) else Path(html).resolve().as_uri(),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def screenshot(
    html: Path | str, png: Path, width: int = 1280, height: int = 2400, timeout: float = 60.0, settle_ms: int = 0
) -> Path:
    """Render ``html`` (a local file, or an http(s) URL) to ``png`` at ``width`` x ``height`` CSS pixels;
    ``settle_ms``: virtual time the page's scripts get before the shot (pages that fetch and draw)."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    proc = _headless(html, [f"--screenshot={png}", f"--window-size={width},{height}"], timeout, settle_ms)
    if not png.exists():
        raise ScreenshotError(f"{find_browser()} wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return png


def rendered_html(html: Path | str, timeout: float = 60.0, settle_ms: int = 0) -> str:
    """The page's DOM as the browser has built it after ``settle_ms`` of its scripts (what a script-drawn page,
    such as the MLflow UI, shows: its text)."""
    proc = _headless(html, ["--dump-dom"], timeout, settle_ms)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ScreenshotError(f"{find_browser()} rendered nothing (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def blankness(png: Path) -> dict[str, float]:
    """Simple measures of how much is drawn: pixel spread, distinct colours, non-white share."""
    from PIL import Image

    with Image.open(png) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int16)
    flat = pixels.reshape(-1, 3)
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    return {
        "std": float(flat.std()),
        "colours": float(colours),
        "non_white": float((flat.min(axis=1) < 245).mean()),
        "height": float(pixels.shape[0]),
        "width": float(pixels.shape[1]),
    }


def assert_not_blank(png: Path, min_colours: int = 50, min_non_white: float = 0.02) -> dict[str, float]:
    measures = blankness(png)
    if measures["colours"] < min_colours or measures["non_white"] < min_non_white:
        raise ScreenshotError(f"{png} looks blank: {measures}")
    return measures
