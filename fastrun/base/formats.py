"""The name and version of every document fastrun writes, in one place.

Each reader checks a file's ``format`` field against these before it trusts anything else in
it, so a rankings file handed to the cache tools (or a cache to the report) is told apart by
content and refused with its kind named.  The cache file's binary header (magic and format
number) is :mod:`fastrun.cache.file`'s own: it is bytes, not a document field.
"""

#: ``fastrun rank`` output (:mod:`fastrun.analysis.rankings`, docs/regression.md)
RANKINGS_FORMAT = "fastrun-rankings"
RANKINGS_VERSION = 1
#: ``fastrun cache export`` output (:mod:`fastrun.cache.tools`, docs/cache-format.md)
CACHE_EXPORT_FORMAT = "fastrun-cache-json"
CACHE_EXPORT_VERSION = 1
#: the msgpack document of a format-1 cache file, still read and converted
CACHE_FORMAT1_NAME = "fastrun-cache"
#: ``load_and_run --profile-json`` output (docs/cli.md)
PROFILE_FORMAT = "fastrun-profile"
PROFILE_VERSION = 1
#: the problems a session missed in its cache (``record=PATH``, :mod:`fastrun.cache.problems`)
PROBLEMS_FORMAT = "fastrun-problems"
PROBLEMS_VERSION = 1
#: per-job search times a ``fastrun tune`` wrote beside its cache (:mod:`fastrun.fleet.jobs`,
#: docs/fleet.md); ``fastrun tune --simulate`` replays them
TUNE_TIMES_FORMAT = "fastrun-tune-times"
TUNE_TIMES_VERSION = 1
