"""The mkdocs hook (``hooks:`` in mkdocs.yml): fills every ``<!-- docsgen: NAME ARGS -->``
marker of a page with the block of that name, so references and results are generated at
each build from the code and the committed JSON."""

from __future__ import annotations

import re
import sys
from pathlib import Path

# mkdocs loads this file by its path, with only its own folder importable
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

from docsgen.blocks import render

MARKER = re.compile(r"<!-- docsgen: (?P<name>[\w-]+)(?P<args>[^>]*?) -->")


def fill(markdown: str) -> str:
    def block(match: re.Match[str]) -> str:
        return render(match["name"], match["args"].split())

    return MARKER.sub(block, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    try:
        return fill(markdown)
    except (KeyError, OSError, ValueError) as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc
