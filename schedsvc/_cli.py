"""The ``schedsvc`` command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedsvc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, devices and the settings in force")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return 2


def _info() -> int:
    import schedsvc

    print(f"schedsvc {schedsvc.__version__}  python {sys.version.split()[0]}")
    print(schedsvc.Config())
    return 0


if __name__ == "__main__":
    sys.exit(main())
