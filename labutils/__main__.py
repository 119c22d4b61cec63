"""`python -m labutils ...`: see labutils.cli."""

from labutils.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
