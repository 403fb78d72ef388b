#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main():
    """Run administrative tasks."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")
    if sys.argv[1:2] == ["serve"]:
        # Before django.setup(): the daphne app makes the web process's event loop when imported.
        from superfluid_site.env import EnvError
        from superfluid_site.eventloop import use_event_loop

        try:
            use_event_loop()
        except EnvError as exc:
            sys.exit(f"serve: {exc}")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Are you sure it's installed and "
            "available on your PYTHONPATH environment variable? Did you "
            "forget to activate a virtual environment?"
        ) from exc
    from superfluid_site.env import EnvError

    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:  # a bad SUPERFLUID_* value: one line naming it, not a traceback
        sys.exit(f"{sys.argv[1] if len(sys.argv) > 1 else 'manage.py'}: {exc}")


if __name__ == "__main__":
    main()
