"""Sweeps: many simulations from one spec, run in a process pool or on Ray, stored as Parquet.

A **sweep spec** is a TOML file: "a command line as a table" plus the axes to vary.

.. code-block:: toml

    version = 1                 # schema version (required)
    kind = "simulate"           # what each point runs: a key of the kind registry
    seed = 7                    # spec seed; every (point, replication) derives its own
    replications = 3            # independent runs per point (default 1)
    metrics = ["ewif", "ewif_se"]   # what to keep (default: the kind's default metrics)
    description = "free text"   # optional

    [base]                      # options of the command, named as its flags without "--"
    policy = "fixed:k=4"        # (dashes or underscores: verify-per-token = verify_per_token)
    tokens = 200000
    cost = [0.05]               # a list repeats the flag: --cost 0.05
    separate-drafter = true     # true gives a flag, false leaves it out

    [grid]                      # every combination (the last key varies fastest)
    alpha = [0.6, 0.7, 0.8]
    k = { start = 1, stop = 8, step = 1 }                  # inclusive integer range
    c = { start = 0.01, stop = 0.3, num = 6, scale = "log" }  # num values, linear or log

    [[zip]]                     # varied together: lists of one length (one axis)
    policy = ["fixed:k=2", "fixed:k=6"]
    tokens = [100000, 400000]

    [random]                    # n samples from distributions, seeded (default: spec seed)
    n = 20
    seed = 3
    alpha = { uniform = [0.5, 0.95] }
    cost = { loguniform = [0.01, 0.3] }
    k = { integers = [1, 8] }   # inclusive
    policy = { choice = ["fixed:k=3", "threshold:h=0.7"] }

Points are the product grid × zip groups × random samples, numbered in that order with the
last varying fastest; each point runs ``replications`` times. A sweep *task* is one
(point, replication); task ``point * replications + replication``. Its seed is derived from
the spec seed with :class:`numpy.random.SeedSequence` (``spawn_key = (point, replication)``),
so results do not depend on the number of workers or the order in which tasks run.

A **kind** (:class:`Kind`) says how a point's configuration is validated (before any work
starts: every point is checked) and run, and which metrics it reports: attribute paths into
the run's typed result, checked against the result types when the kind is made. The
registry lives with the commands' configurations (``draftsim.sweepkinds``: a point becomes
a command's config, its function runs it); this package is the machinery:

- :mod:`.spec`       the spec schema: parsing, axes, points, seeds, checks before any work
- :mod:`.tasks`      kinds, tasks and running one task (metrics read from its result)
- :mod:`.rows`       the bookkeeping columns of a results row (:class:`SweepRow`), defined once
- :mod:`.storage`    the output folder: Parquet shards, manifest
- :mod:`.executors`  running the tasks: in this process, a process pool or on Ray

**Output folder**::

    OUT/manifest.json           schema version, the spec, its hash, columns, shards, counts
    OUT/results/part-*.parquet  one row per task; load(OUT) or pyarrow.parquet.read_table(OUT + "/results")

Each shard is written to a hidden temporary file and renamed into place (atomic), then the
manifest is rewritten (temp + rename). The shards are the truth: a resumed sweep reads the
task ids they hold and runs only the others, so a killed sweep loses and repeats nothing.
Columns: ``task``, ``point``, ``replication``, ``seed``, one per varied option, ``status``
(``ok`` / ``failed``), ``error``, ``seconds`` (wall) and ``cpu_seconds`` of the run, then one
float64 column per metric.
"""

from .executors import Summary, call, ray_available, run_sweep, run_tasks, start_ray, worker_modules
from .spec import (
    DISTRIBUTIONS,
    MAX_AXIS_VALUES,
    MAX_TASKS,
    SPEC_KEYS,
    SPEC_VERSION,
    Point,
    Spec,
    check_size,
    derive_seed,
    load_spec,
    option_name,
    parse_spec,
    random_samples,
    validate_points,
)
from .storage import (
    LEAD_COLUMNS,
    MANIFEST_VERSION,
    STATUS_COLUMNS,
    Store,
    SweepRow,
    aggregate,
    cell,
    load,
    numeric,
    read_manifest,
    record_fields,
    schema_for,
)
from .tasks import Kind, Outcome, Task, as_metric, execute, lookup, one_line, resolve_path

__all__ = [
    "Summary", "call", "ray_available", "run_sweep", "run_tasks", "start_ray", "worker_modules",
    "DISTRIBUTIONS", "MAX_AXIS_VALUES", "MAX_TASKS", "SPEC_KEYS", "SPEC_VERSION", "Point", "Spec", "check_size", "derive_seed",
    "load_spec", "option_name", "parse_spec", "random_samples", "validate_points",
    "LEAD_COLUMNS", "MANIFEST_VERSION", "STATUS_COLUMNS", "Store", "SweepRow", "aggregate", "cell", "load", "numeric",
    "read_manifest", "record_fields", "schema_for",
    "Kind", "Outcome", "Task", "as_metric", "execute", "lookup", "one_line", "resolve_path",
]
