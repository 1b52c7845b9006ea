"""The command-line reference, read from the parser ``specroute.cli.parser()`` builds: every
command, its usage and every flag, so a flag added in code is documented without an edit."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from docsgen.markdown import code, table
from specroute.cli import parser
from specroute.router.settings import RouterSettings
from specroute.router.settings.spelling import spellings

_SETTINGS_PAGE = "settings.md"


def commands(root: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command under ``root``, depth first: ``("specroute bench compare", parser)``."""
    yield root.prog, root
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def _summaries(root: argparse.ArgumentParser) -> dict[str, str]:
    """Each command's one-line help, as its parent lists it."""
    found: dict[str, str] = {}
    for _, command in commands(root):
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    found[f"{command.prog} {choice.dest}"] = choice.help or ""
    return found


def _usage(command: argparse.ArgumentParser) -> str:
    """The usage line at a fixed width, whatever the terminal building the docs."""
    formatter = argparse.HelpFormatter(prog=command.prog, width=88)
    formatter.add_usage(command.usage, command._actions, command._mutually_exclusive_groups)
    first, *more = formatter.format_help().strip().splitlines()
    indent = len("usage: ")
    return "\n".join([first[indent:], *(line[indent:] for line in more)])


def _help(command: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return command._get_formatter()._expand_help(action)


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default == argparse.SUPPRESS or isinstance(action.const, bool):
        return ""
    if isinstance(default, list | tuple):
        return ",".join(str(x) for x in default)
    return str(default)


def _flag(action: argparse.Action) -> str:
    return argparse.HelpFormatter(prog="")._format_action_invocation(action)


def _rows(command: argparse.ArgumentParser, serve: bool) -> list[list[str]]:
    fields = spellings(RouterSettings)
    rows = []
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        about = _help(command, action)
        default = _default(action)
        if serve and action.dest in fields:  # serve's defaults are the settings'
            about = f"{about} [setting `{action.dest}`]({_SETTINGS_PAGE}#{action.dest})".strip()
            default = ""
        if action.required:
            about = f"required; {about}".rstrip("; ")
        rows.append([code(_flag(action)), code(default), about])
    return rows


def cli_reference() -> str:
    """The whole reference, one section per command."""
    root = parser()
    summaries = _summaries(root)
    parts = []
    for name, command in commands(root):
        depth = min(name.count(" ") + 2, 4)
        parts.append(f"{'#' * depth} `{name}`\n")
        summary = summaries.get(name) or ""
        about = command.description or summary
        if about:
            parts.append(about.split("\n\n")[0].replace("\n", " ") + "\n")
        usage = _usage(command)
        parts.append(f"```text\n{usage}\n```\n")
        rows = _rows(command, serve=name == "specroute serve")
        if rows:
            parts.append(table(["flag", "default", "what"], rows))
        if command.epilog and name == root.prog:
            parts.append(f"```text\n{command.epilog.strip()}\n```\n")
    return "\n".join(parts)
