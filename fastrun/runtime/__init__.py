"""The ONNX runtime: load a model, search its problems once, run it through the registry.

``fastrun.runtime.load("model.onnx")`` (or ``"zoo:resnet18"``) reads and checks the graph,
lowers it onto registry operators with constants folded and conv epilogues fused, and returns a
:class:`Model`; its first run (or :meth:`Model.search`) decides every problem through the
current session, so the session's strategy and cache decide whether that is a search, a cache
lookup or a rule of thumb.  The onnx package is imported only when a model is loaded.

What it may import: the session facade (``fastrun.api``), the core, the cache, the device
protocol and the base modules; never the analysis tools or the CLI, and never a device
backend or the compute library (operators are known by name, through the registry).
"""

from fastrun.runtime.errors import ModelError, UnsupportedOperatorError
from fastrun.runtime.model import Model, StepReport, load

__all__ = ["Model", "ModelError", "StepReport", "UnsupportedOperatorError", "load"]
