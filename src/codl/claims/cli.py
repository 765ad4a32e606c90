"""``codl claims check | render``: the registry's numbers against the pages that cite them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "claims", help="check or render the README's and results pages' numbers from the tables"
    )
    c.add_argument("action", choices=("check", "render"))
    c.add_argument(
        "--root", type=Path, default=Path("."), help="the checkout (default: the current directory)"
    )
    c.set_defaults(func=cmd_claims)


def cmd_claims(args: argparse.Namespace) -> int:
    from codl.claims.check import check, render_all

    root = Path(args.root)
    if args.action == "render":
        for path in render_all(root):
            print(f"rewrote {path}")
        return 0
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0
