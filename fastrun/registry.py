"""Registry of operators and algorithms.

The framework knows operators only through a registry.  Compute libraries (ours included) add
theirs through the ``fastrun.plugins`` entry point: a callable that receives the registry.  Plugins
are loaded on the first lookup, not at import, so ``import fastrun`` stays cheap.

Plugins load in whatever order the installed distributions' entry points come in (it follows
names and paths, not dependencies), so an algorithm a plugin registers for an operator that a
later plugin provides is held until every plugin has run, then registered; one whose operator
no plugin provides is the plugin's load error, naming the operator.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from importlib.metadata import entry_points

from fastrun.algorithm import Algorithm
from fastrun.operator import Operator

log = logging.getLogger(__name__)

PLUGIN_GROUP = "fastrun.plugins"


class RegistryError(LookupError):
    pass


class Registry:
    def __init__(self, load_plugins: bool = True):
        self._operators: dict[str, Operator] = {}
        self._algorithms: dict[str, dict[str, Algorithm]] = {}
        #: set once every plugin has been loaded (never while loading: other threads wait)
        self._plugins_loaded = not load_plugins
        #: set while the loading thread runs the plugins (their own lookups must not recurse)
        self._loading = False
        self._lock = threading.RLock()
        #: plugin name -> error text, for plugins that failed to load
        self.plugin_errors: dict[str, str] = {}
        #: (operator, device kind) -> derived algorithm-set version; cleared on registration
        self._versions: dict[tuple[str, str], str] = {}
        #: while plugins load: the plugin loading now, and (plugin, algorithm) registered for
        #: an operator that no plugin had registered yet
        self._plugin: tuple[str, str] | None = None  # (name, "module:function")
        self._held: list[tuple[tuple[str, str], Algorithm]] = []

    # -- registration ------------------------------------------------------------------------
    def register_operator(self, operator: Operator) -> Operator:
        with self._lock:
            if operator.name in self._operators:
                raise RegistryError(f"operator {operator.name!r} is already registered")
            self._operators[operator.name] = operator
            self._algorithms[operator.name] = {}
            self._versions.clear()
        return operator

    def register_algorithm(self, algorithm: Algorithm) -> Algorithm:
        """Add an algorithm of a registered operator.  An operator a plugin provides may be
        named before any lookup: the plugins are loaded first."""
        if algorithm.operator not in self._operators:
            self._ensure_plugins()
        with self._lock:
            table = self._algorithms.get(algorithm.operator)
            if table is None and self._loading and self._plugin is not None:
                self._held.append((self._plugin, algorithm))  # its operator may come later
                return algorithm
            if table is None:
                raise RegistryError(
                    f"cannot register {algorithm.desc}: operator {algorithm.operator!r} is not "
                    "registered; register the operator first"
                )
            if algorithm.desc.text in table:
                raise RegistryError(f"algorithm {algorithm.desc} is already registered")
            table[algorithm.desc.text] = algorithm
            self._versions.clear()
        return algorithm

    # -- lookup ------------------------------------------------------------------------------
    def operator(self, name: str) -> Operator:
        self._ensure_plugins()
        try:
            return self._operators[name]
        except KeyError:
            known = ", ".join(sorted(self._operators)) or "none"
            raise RegistryError(f"unknown operator {name!r} (registered: {known})") from None

    def operators(self) -> list[str]:
        self._ensure_plugins()
        return sorted(self._operators)

    def algorithms(self, operator: str) -> list[Algorithm]:
        self.operator(operator)
        return list(self._algorithms[operator].values())

    def algorithm_set_version(self, operator: str, device_kind: str) -> str:
        """The version of ``operator``'s algorithm set on devices of ``device_kind``: a short
        hash of the operator's own version, the names and versions of its algorithms of that
        kind, and the algorithm-set versions of the operators they call (``sub_operators``,
        followed to any depth; an operator calling itself, like Strassen's matmul, counts
        once).  It is the cache category's ``algorithms`` fact, so a change to matmul's
        algorithms invalidates conv's entries by itself, an OpenCL configuration added does
        not touch CPU entries, and an unchanged operator's entries stay valid."""
        key = (operator, device_kind)
        version = self._versions.get(key)
        if version is None:
            with self._lock:
                version = self._versions[key] = self._derive_version(operator, device_kind,
                                                                     frozenset())
        return version

    def _derive_version(self, operator: str, device_kind: str, calling: frozenset[str]) -> str:
        lines = [f"{operator} {self.operator(operator).version}"]
        called: set[str] = set()
        for algorithm in sorted(self.algorithms(operator), key=lambda a: a.desc.text):
            if algorithm.device_kind == device_kind:
                lines.append(f"{algorithm.desc.text} {algorithm.version}")
                called.update(algorithm.sub_operators)
        for sub in sorted(called - calling - {operator}):
            sub_version = (self._derive_version(sub, device_kind, calling | {operator})
                           if sub in self._operators else "not registered")
            lines.append(f"calls {sub} {sub_version}")
        return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]

    # -- plugins -----------------------------------------------------------------------------
    def _ensure_plugins(self) -> None:
        """Load the plugins once.  Threads whose first lookup comes while another thread loads
        them wait for it to finish (the flag is set only afterwards: set before, as it once
        was, 7 of 8 threads making their first call together found no operator); a lookup a
        plugin makes while it registers returns at once."""
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded or self._loading:
                return
            self._loading = True
            try:
                for entry in entry_points(group=PLUGIN_GROUP):
                    self._plugin = (entry.name, entry.value)
                    try:
                        entry.load()(self)
                        log.debug("loaded fastrun plugin %s (%s)", entry.name, entry.value)
                    except Exception as error:
                        self._plugin_failed(self._plugin, f"{type(error).__name__}: {error}")
                self._plugin = None
                self._register_held()
            finally:
                self._plugin, self._held = None, []
                self._loading = False
                self._plugins_loaded = True

    def _register_held(self) -> None:
        """Register the algorithms held for operators that later plugins provided; a plugin
        whose operator none provided failed to load, and says which operator."""
        for plugin, algorithm in self._held:
            if plugin[0] in self.plugin_errors:
                continue
            try:
                self.register_algorithm(algorithm)
            except RegistryError as error:
                self._plugin_failed(plugin, f"RegistryError: {error}")

    def _plugin_failed(self, plugin: tuple[str, str], why: str) -> None:
        name, value = plugin
        self.plugin_errors.setdefault(name, why)
        log.warning("fastrun plugin %r (%s) failed to load: %s", name, value, why)


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry, with every installed plugin."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default
