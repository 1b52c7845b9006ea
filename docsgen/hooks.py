"""The mkdocs hook (``hooks:`` in mkdocs.yml): fills every ``<!-- docsgen: NAME ARGS -->``
marker of a page with the block of that name, so references and results are generated at
each build from the code and the committed JSON."""

from __future__ import annotations

import posixpath
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

MARKER = re.compile(
    r"(?P<indent>^[ ]+)?<!-- docsgen: (?P<name>[\w-]+)(?P<args>[^>]*?) -->", re.MULTILINE
)


# where blocks link to (``(@data/x.json)``), from the docs folder's root
FOLDERS = {"@data": "results/data", "@figures": "figures"}


def fill(markdown: str, page: str = "index.md") -> str:
    """The page's markers filled; ``page``: its path in the docs folder, which the blocks'
    links are made relative to."""

    def block(match: re.Match[str]) -> str:
        text = render(match["name"], match["args"].split())
        for mark, folder in FOLDERS.items():
            text = text.replace(f"({mark}/", f"({posixpath.relpath(folder, where)}/")
        indent = match["indent"]  # a block inside a note or a list keeps its place
        return indent + text.replace("\n", "\n" + indent).rstrip(" ") if indent else text

    where = posixpath.dirname(page) or "."
    return MARKER.sub(block, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    try:
        return fill(markdown, page.file.src_uri)
    except (KeyError, OSError, ValueError) as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc
