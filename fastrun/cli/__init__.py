"""The command-line tools: ``fastrun`` (``main.py``: profile, rank, regress, report, cache,
algorithms, config) and ``load_and_run``.  Each command parses its arguments, calls the library
and prints; a user's mistake is a message and an exit status, never a traceback.

What it may import: everything below it (the analysis tools, the runtime, the session facade,
the core, the cache, the devices, the base modules); nothing imports it but ``fastrun.__main__``
and the console scripts.
"""
