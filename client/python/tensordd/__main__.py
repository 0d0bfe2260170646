"""``python3 -m tensordd --version``: the client and wire protocol versions;
``python3 -m tensordd ping [ENDPOINT]``: connect (default $TENSORDD_ENDPOINT)
and list the daemon's devices."""

from __future__ import annotations

import sys

from . import PROTOCOL_VERSION, __version__, connect


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"tensordd-python {__version__} (protocol {PROTOCOL_VERSION})")
        return 0
    if args[0] == "ping":
        with connect(args[1] if len(args) > 1 else None, timeout=10) as s:
            print(f"{s.endpoint}: {s.server}, session {s.session_id}")
            for d in s.device_info():
                print(f"  {d['device']}  {d['name']}")
        return 0
    print(f"unknown argument {args[0]!r}; try --help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
