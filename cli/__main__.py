"""``python -m hbmwatch.cli``: the same command as the ``hbmwatch`` script."""

from hbmwatch.cli.main import main

main()
