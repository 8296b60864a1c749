"""Fleet tuning (``fastrun tune``, docs/fleet.md): the problems of models, suites and recorded
files as jobs with their sub-problems (:mod:`.jobs`), one scheduler for real tunes and
simulated ones (:mod:`.scheduler`), the worker's side (:mod:`.worker`), local processes or a
Ray cluster to run workers on (:mod:`.engines`), and the driver that checks each worker's
category and writes each result into the one cache as it arrives (:mod:`.driver`);
:mod:`.tune` puts them together.

What it may import: everything below the CLI (it lowers models and reads suites); only the
CLI imports it.  Ray is imported when a Ray tune starts, never at import.
"""
