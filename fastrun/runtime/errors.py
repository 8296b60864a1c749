"""The runtime's errors: each names what was wrong and where, before any work is done."""

from __future__ import annotations


class ModelError(ValueError):
    """The model file or graph is malformed (unreadable, fails the ONNX checker, dangling
    inputs, shapes that cannot be resolved)."""


class UnsupportedOperatorError(ModelError):
    """The model uses ONNX operators (or operator forms) the runtime cannot execute."""

    def __init__(self, problems: list[tuple[str, str, str]], supported: list[str] | None = None):
        #: (op_type, node name, why) for every unsupported node
        self.problems = list(problems)
        lines = [f"{op_type} (node {name!r}): {why}" for op_type, name, why in problems[:20]]
        if len(problems) > 20:
            lines.append(f"... and {len(problems) - 20} more")
        kinds = sorted({op for op, _, _ in problems})
        # the list of what is supported once, not per node: a transformer has hundreds
        footer = f"\nfastrun lowers these op types: {', '.join(supported)}" if supported else ""
        super().__init__(
            f"the model uses {len(problems)} node(s) fastrun cannot run "
            f"(op types: {', '.join(kinds)}):\n  " + "\n  ".join(lines) + footer)


class DeviceUnsupportedError(ModelError):
    """Operators of the model have no algorithm for the session's kind of device (an OpenCL
    device where only CPU algorithms exist).  Raised before any search, naming every such
    node at once, so a user learns all that is missing from one attempt rather than one node
    per (possibly long) search."""

    def __init__(self, device: str, kind: str, missing: list[tuple[str, str, str, str]]):
        #: (node, op type, operator, device kinds its algorithms run on) per node
        self.missing = list(missing)
        #: the operators without an algorithm of this device's kind, in model order
        self.operators = list(dict.fromkeys(operator for _, _, operator, _ in missing))
        lines = [f"node {node!r} ({op_type}): operator {operator} (algorithms for: "
                 f"{kinds or 'none'})" for node, op_type, operator, kinds in missing[:20]]
        if len(missing) > 20:
            lines.append(f"... and {len(missing) - 20} more")
        super().__init__(
            f"{len(missing)} step(s) of the model use operators with no algorithm for {kind} "
            f"devices (device {device}):\n  " + "\n  ".join(lines)
            + f"\nrun the model on a device of another kind (e.g. cpu), or add {kind} "
            f"algorithms for: {', '.join(self.operators)}")
