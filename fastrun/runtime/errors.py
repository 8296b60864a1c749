"""The runtime's errors: each names what was wrong and where, before any work is done."""

from __future__ import annotations


class ModelError(ValueError):
    """The model file or graph is malformed (unreadable, fails the ONNX checker, dangling
    inputs, shapes that cannot be resolved)."""


class UnsupportedOperatorError(ModelError):
    """The model uses ONNX operators (or operator forms) the runtime cannot execute."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        #: (op_type, node name, why) for every unsupported node
        self.problems = list(problems)
        lines = [f"{op_type} (node {name!r}): {why}" for op_type, name, why in problems[:20]]
        if len(problems) > 20:
            lines.append(f"... and {len(problems) - 20} more")
        kinds = sorted({op for op, _, _ in problems})
        super().__init__(
            f"the model uses {len(problems)} node(s) fastrun cannot run "
            f"(op types: {', '.join(kinds)}):\n  " + "\n  ".join(lines))
