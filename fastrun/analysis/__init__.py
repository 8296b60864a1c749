"""Analysis of measurements: problem suites (:mod:`.suites`), full rankings and the regression
check (:mod:`.rankings`), and the HTML report (:mod:`.report`).

What it may import: the core (operators, the registry, the chooser), the cache, the devices
and the runtime (a model suite lowers a model); nothing imports this package but the CLI and
benchmarks, so its tools can grow without touching what a call dispatches through.
"""
