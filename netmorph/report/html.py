"""The tour's one HTML page: sections with text, figures (PNG files beside it) and tables."""

from __future__ import annotations

import html as _html
from dataclasses import dataclass, field
from datetime import datetime, timezone

from netmorph.files import write_text


@dataclass
class Section:
    """One part of the tour: HTML text, figures beside the page, and lines for the terminal."""

    title: str
    html: str
    figures: list = field(default_factory=list)  # (file name, caption)
    summary: list = field(default_factory=list)  # terminal lines


CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
td, th { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: right; }
th { background: #f5f5f5; } td:first-child, th:first-child { text-align: left; }
code { background: #f3f3f3; padding: 0.1em 0.3em; border-radius: 3px; }
.meta { color: #777; font-size: 0.85em; }
"""


def write_page(path, sections, version: str) -> None:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>netmorph tour</title>"
        f"<style>{CSS}</style></head><body>",
        "<h1>netmorph tour</h1>",
        "<p>The distributed system under a large neural network, measured in the two quantities NCCL and "
        "Megatron-LM trade against each other: <b>bytes on the wire</b> and <b>message rounds</b>.</p>",
        f"<p class='meta'>netmorph {version}, generated "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</p>",
    ]
    for sec in sections:
        parts.append(f"<h2>{_html.escape(sec.title)}</h2>")
        parts.append(sec.html)
        for name, caption in sec.figures:
            parts.append(
                f"<figure><img src='{name}' alt='{_html.escape(caption)}'>"
                f"<figcaption>{_html.escape(caption)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    write_text(path, "\n".join(parts))
