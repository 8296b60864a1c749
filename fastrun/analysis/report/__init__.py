"""A self-contained HTML report of a cache or rankings file: what was measured, what wins.

``fastrun report`` turns the numbers of a persistent cache (or of a rankings file written by
``fastrun rank``) into one HTML page that can be attached to a CI run or mailed around: inline
CSS and inline SVG only, no scripts, fonts, images or other files, so it shows the same
everywhere, offline, and cannot leak anything by loading a URL.

Three modules, one job each, in the one direction of their imports:

* :mod:`.data` reads a file into :class:`ReportData` and a searched model's step reports into
  :class:`LayerRow` values (the cache's own reader, never a ``FileCache``, which would move a
  damaged file aside);
* :mod:`.charts` formats numbers and draws the SVG charts from those records;
* :mod:`.page` puts the CSS, the sections and the charts together: :func:`render`.

Nothing here prints, writes files or touches the input file.  What it may import: the cache
(its reader and records), the rankings, the category facts and the base modules.
"""

from fastrun.analysis.report.charts import pareto_front, scatter_chart
from fastrun.analysis.report.data import (
    DEFAULT_MAX_PROBLEMS,
    LayerRow,
    ModelData,
    ProblemData,
    ReportData,
    ReportInputError,
    model_rows,
    problem_anchor,
    read_input,
)
from fastrun.analysis.report.page import render

__all__ = ["DEFAULT_MAX_PROBLEMS", "LayerRow", "ModelData", "ProblemData", "ReportData",
           "ReportInputError", "model_rows", "pareto_front", "problem_anchor", "read_input",
           "render", "scatter_chart"]
