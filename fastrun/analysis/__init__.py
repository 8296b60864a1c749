"""Analysis of measurements: problem suites (:mod:`.suites`), full rankings and the regression
check (:mod:`.rankings`), the HTML report (:mod:`.report`), and what a model's measured
choices gain over the rules of thumb (:mod:`.gain`).

What it may import: the core (operators, the registry, the chooser), the cache, the devices
and the runtime (a model suite lowers a model); nothing imports this package but the CLI and
benchmarks, so its tools can grow without touching what a call dispatches through.
"""
