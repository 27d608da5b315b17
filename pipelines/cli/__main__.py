"""``python -m pipelines.cli``: the ``aio-dms`` command, as the installed entry point runs it."""

if __name__ == "__main__":
    from pipelines.__main__ import main

    main()
