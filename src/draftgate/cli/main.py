"""The `draftgate` command line: builds configs, calls the library, turns errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from draftgate.errors import DraftGateError

__all__ = ["main", "entry", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from draftgate.cli import demo, generate, tools

    p = argparse.ArgumentParser(
        prog="draftgate",
        description="Lossless speculative decoding: engine, gateway and tools.",
        epilog="Run `draftgate COMMAND --help` for a command's options.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in (generate, demo, tools, *_optional_commands()):
        mod.register(sub)
    return p


def _optional_commands() -> list:  # type: ignore[type-arg]
    """Commands that live in upper layers (bench, serve...) register if present."""
    import importlib

    mods = []
    for name in (
        "draftgate.cli.bench",
        "draftgate.cli.serve",
        "draftgate.cli.workers",
        "draftgate.cli.distill",
        "draftgate.cli.check_lossless",
    ):
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return mods


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser.parse_args(argv)
    a.argv = argv  # the command as given (reports record it)
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    try:
        return int(a.func(a))
    except (DraftGateError, ValueError) as e:
        print(f"draftgate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftgate: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())
