"""The base layer's helpers that are not the plugin API: the pieces every layer above may use.

* :mod:`.problem`: ``Problem`` and its canonical key (re-exported by ``fastrun.operator``,
  where algorithms import it);
* :mod:`.max_error`: the numerical check's arithmetic in one compiled pass;
* :mod:`.formats`: the name and version of every document fastrun writes;
* :mod:`.files`: atomic file replacement;
* :mod:`.units`: sizes, durations and counts as people read them.

What it may import: nothing of fastrun but the modules at the top of the package
(``fastrun.numba_cache``, ``fastrun.config``).  The plugin API (``fastrun.algorithm``,
``fastrun.operator``, ``fastrun.attribute``, ``fastrun.registry``, ``fastrun.category``,
``fastrun.numba_cache``) stays at the top because plugins import it there.
"""
