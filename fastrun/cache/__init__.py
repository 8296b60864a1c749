"""The persistent cache: what was measured, shared by processes, trusted across machines.

Four modules, one job each, in one direction of imports:

* :mod:`.file`: the bytes of a cache file (a header naming the file's generation, a snapshot,
  an append-only log of framed put records), read so that a damaged record costs only itself;
* :mod:`.lock`: the file lock, which waiters sleep on;
* :mod:`.store`: the semantics (:class:`Entry`, Pareto pruning per attribute set, merging,
  :class:`InMemoryCache`, :class:`FileCache` shared between processes through a file lock);
* :mod:`.tools`: ``fastrun cache`` (show, export, import, merge, prune, verify).

What it may import: the core's category facts and settings (``fastrun.category``,
``fastrun.config``, ``fastrun.base.formats``, ``fastrun.attribute``); never the chooser, the
runtime or a device.  Everything users import from ``fastrun.cache`` is re-exported here.
"""

from fastrun.cache.file import CacheFormatError
from fastrun.cache.store import (
    CACHE_FORMAT_VERSION,
    COMPACT_AFTER_BYTES,
    CacheCorruptWarning,
    CacheLockTimeout,
    CacheUnwritableWarning,
    Categories,
    Entry,
    FileCache,
    InMemoryCache,
    PersistentCache,
    check_entries,
    default_cache,
    entry_from_raw,
    entry_order,
    entry_to_raw,
    low_confidence,
    merge_entries,
    prune,
    read_cache_file,
    set_default_cache,
    unstable,
)

__all__ = [
    "CACHE_FORMAT_VERSION", "COMPACT_AFTER_BYTES", "CacheCorruptWarning", "CacheFormatError",
    "CacheLockTimeout", "CacheUnwritableWarning", "Categories", "Entry", "FileCache",
    "InMemoryCache", "PersistentCache", "check_entries", "default_cache", "entry_from_raw",
    "entry_order", "entry_to_raw", "low_confidence", "merge_entries", "prune", "read_cache_file",
    "set_default_cache", "unstable",
]
