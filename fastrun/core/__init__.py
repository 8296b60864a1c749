"""The decision machinery: how a problem becomes a choice.

* :mod:`.strategy`, :mod:`.limits` and :mod:`.tuning`: the search options, the workspace
  limit, the budgeted search's sampling and stopping rules;
* :mod:`.profiler`: timing candidates on a device and checking them against the reference;
* :mod:`.chooser`: ``AlgoChooser``, which decides (cache, heuristic or profile), prepares and
  dispatches calls;
* :mod:`.reasons`: structured exclusion reasons and decision sources;
* :mod:`.progress`: search progress, as log lines and as a bar on a terminal.

What it may import: the base modules at the top of the package (the plugin API
``fastrun.algorithm``, ``fastrun.operator``, ``fastrun.attribute``, ``fastrun.registry``, and
``fastrun.config``, ``fastrun.category``, and ``fastrun.base``), the cache and the device protocol
(``fastrun.devices``, never a backend); never the session facade, the runtime, the analysis
tools or the CLI.  The plugin API stays at the top because plugins import it there.
"""
